import os

import sibling_module

print("sibling says", sibling_module.VALUE, "cwd", os.getcwd())
