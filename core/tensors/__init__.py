"""The census of live tensors: what it is (model), how it is taken (walk), and when (schedule)."""
