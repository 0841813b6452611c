"""Task formats, the candidate's side: fences, prompt + body assembly, what compiles."""

from __future__ import annotations

from grpo_cli.rewards.code.tasks import assemble_program, compiles, defines_at_top_level, prompt_text, strip_fences

PROMPT = 'def add(a, b):\n    """Sum of a and b.\n\n    >>> add(1, 2)\n    3\n    """\n'


# ---- fences ------------------------------------------------------------------------------------
def test_fences_python_plain_and_unclosed_are_stripped() -> None:
    assert strip_fences("```python\nx = 1\n```") == "x = 1\n"
    assert strip_fences("Sure!\n```\nx = 2\n```\nThat is all.") == "x = 2\n"
    assert strip_fences("```py\nx = 3\n") == "x = 3\n"  # cut off by max_new_tokens: runs to the end


def test_the_first_of_several_fenced_blocks_is_taken() -> None:
    text = "```python\nfirst = 1\n```\nand a test:\n```python\nassert first == 1\n```\n"
    assert strip_fences(text) == "first = 1\n"


def test_text_without_fences_is_left_alone_and_huge_input_is_capped() -> None:
    assert strip_fences("    return a + b\n") == "    return a + b\n"
    assert len(strip_fences("x" * 300_000)) == 100_000


# ---- assembly ------------------------------------------------------------------------------------
def test_a_function_body_is_appended_to_the_prompt() -> None:
    program = assemble_program(PROMPT, "    return a + b\n", "add")
    assert program == PROMPT + "    return a + b\n"
    namespace: dict = {}
    exec(program, namespace)
    assert namespace["add"](2, 5) == 7


def test_a_fenced_body_is_unfenced_before_assembly() -> None:
    assert assemble_program(PROMPT, "```python\n    return a + b\n```", "add") == PROMPT + "    return a + b\n"


def test_a_whole_program_that_defines_the_entry_point_stands_alone() -> None:
    whole = "import operator\n\n\ndef add(a, b):\n    return operator.add(a, b)\n"
    assert assemble_program(PROMPT, f"Here it is:\n```python\n{whole}```\n", "add") == whole


def test_a_prompt_without_final_newline_and_a_chat_prompt_are_joined_cleanly() -> None:
    assert assemble_program("def f(x):", "    return x\n", "f") == "def f(x):\n    return x\n"
    chat = [{"role": "system", "content": "Write Python."}, {"role": "user", "content": f"```python\n{PROMPT}```"}]
    assert prompt_text(chat) == PROMPT
    assert assemble_program(chat, "    return a + b\n", "add") == PROMPT + "    return a + b\n"


def test_io_programs_are_never_prefixed() -> None:
    assert assemble_program("Read n and print n + 1.", "print(int(input()) + 1)\n", None) == "print(int(input()) + 1)\n"


def test_defines_at_top_level_sees_defs_classes_assignments_and_imports() -> None:
    assert defines_at_top_level("def add(a, b):\n    return a + b\n", "add")
    assert defines_at_top_level("class add:\n    pass\n", "add")
    assert defines_at_top_level("add = lambda a, b: a + b\n", "add")
    assert defines_at_top_level("from operator import add\n", "add")
    assert not defines_at_top_level("def outer():\n    def add(a, b):\n        return a + b\n", "add")
    assert not defines_at_top_level("def adder(a, b):\n    return a + b\n", "add")
    assert defines_at_top_level("def add(a, b):\n    return (\n", "add")  # broken code: the line still counts


def test_compiles_runs_nothing() -> None:
    assert compiles("import os\nos._exit(3)\n")  # compiled, never executed: we are still here
    assert not compiles("def f(:\n")
    assert not compiles("x = '\0'\0")
