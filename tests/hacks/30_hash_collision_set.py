"""Makes the receiver build a set and a dict of 20,000 integers whose hashes all collide (multiples of 2**61 - 1),
which costs quadratic time: it writes those replies straight onto the reply channel (cheap to write, dear to read).
# tests: ["assert uniques([1, 1, 2]) == {1, 2}", "assert counts([1, 1]) == {1: 2}"]
# honest: "def uniques(xs):\n    return set(xs)\ndef counts(xs):\n    return {x: xs.count(x) for x in xs}\n"
# wrong: "def uniques(xs):\n    return set()\ndef counts(xs):\n    return {}\n"
"""
import json, os, time
P = 2 ** 61 - 1
_items = [["i", str(i * P)] for i in range(20000)]
def _send(value):
    data = (json.dumps({"v": value, "m": []}) + "\n").encode()
    while data: data = data[os.write(6, data):]
    time.sleep(60)
def uniques(xs): _send(["S", _items])
def counts(xs): _send(["d", [[k, ["i", "1"]] for k in _items]])
