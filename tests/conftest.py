"""Shared test set-up: the helpers in tests/ (op_check) importable from every test folder."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
