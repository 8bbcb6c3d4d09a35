"""The judge parses untrusted code on the reward pool's threads: many parses at once must all succeed.

CPython 3.11's `ast.parse` keeps the count it uses to convert a tree in state shared by every thread, so a thread that
runs Python code in the middle of another's parse (a garbage collection with callbacks, for one) can make that parse
raise `SystemError: AST constructor recursion depth mismatch`, which stopped a reward batch. The test makes such
switches frequent (a collection every few allocations, a callback that yields, a tiny switch interval) and parses
from four threads through the judge's own functions.
"""
import gc, sys, threading, time
from grpo_nb.sandbox import calls_of, program_names

PROGRAM = "import math\ndef f(x):\n    return " + "(" * 30 + "math.floor(x)" + ")" * 30 + "\n"
TEST = "assert " + "(" * 30 + "f(1)" + ")" * 30 + " == 1"


def test_programs_parse_on_many_threads_at_once():
    errors = []
    def work():
        for _ in range(300):
            try:
                assert calls_of(TEST, program_names(PROGRAM, "f")) == {"f"}
            except Exception as e:   # SystemError from a parse that another thread disturbed
                errors.append(e)
    yield_in_gc = lambda phase, info: time.sleep(0) if phase == "start" else None
    threshold, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.callbacks.append(yield_in_gc); gc.set_threshold(1, 1, 1); sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
    finally:
        gc.callbacks.remove(yield_in_gc); gc.set_threshold(*threshold); sys.setswitchinterval(interval)
    assert not errors, {repr(e)[:120] for e in errors}
