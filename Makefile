# The two commands of the README. Both set everything up first (idempotent).
.PHONY: demo test setup lint

demo: setup
	scripts/launch-demo.sh

test: setup
	scripts/run-tests.sh

setup:
	scripts/setup.sh

lint: setup
	.venv/bin/ruff check . && .venv/bin/lint-imports
