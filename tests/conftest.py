import sys
from pathlib import Path

# The template's tests import their helpers (matrix, generate) from this folder.
sys.path.insert(0, str(Path(__file__).parent))
