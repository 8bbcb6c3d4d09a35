"""Monkeypatches json and the repr of plain types it can reach, and replaces sys.modules entries."""
import builtins, json, sys
def add(a, b): return a * b + 7   # wrong: fails every test honestly
json.dumps = lambda *a, **k: '["b",true]'
builtins.repr = lambda x: "True"
builtins.type = lambda x: int
sys.modules["json"] = None
