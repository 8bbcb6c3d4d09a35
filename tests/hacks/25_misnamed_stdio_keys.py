"""stdin/stdout cases with misnamed keys (`inputs`/`outputs`, `stdin`/`expected_output`): the missing keys defaulted to
"", so a program that prints nothing passed. Such cases must be refused, for every program.
# tests: [{"inputs": "1 2\n", "outputs": "3\n"}, {"stdin": "2 2\n", "expected_output": "4\n"}]
# honest: "a, b = map(int, input().split())\nprint(a + b)\n"
# wrong: "a, b = map(int, input().split())\nprint(a * b + 7)\n"
# refused: true
"""
pass
