NUM_GPUS = 0

import json
import string

import pytest
from qwen_tokenizer import write_qwen_tokenizer

from dynarl.components.agents.chat_format import ChatFormat
from dynarl.components.agents.messages import ChatMessage, ToolCall, ToolSpec
from dynarl.components.model.tokenizer import CharTokenizer, load_tokenizer

CALL = ToolCall("call_0", "calc", '{"x": "1+2"}')
TOOLS = (ToolSpec("calc", "adds", {"type": "object", "properties": {"x": {"type": "string"}}}),)
SYSTEM, USER = ChatMessage("system", "be brief"), ChatMessage("user", "1+2?")
CALLING = ChatMessage("assistant", "ok", (CALL,))
RESULT = ChatMessage("tool", "3", tool_call_id="call_0", name="calc")
ANSWER = ChatMessage("assistant", "It is 3.")
THANKS = ChatMessage("user", "thanks")


def chars(text):
    """The CharTokenizer's ids, from its definition: 3 + the index in string.printable."""
    return [3 + string.printable.index(ch) for ch in text]


def test_tiny_format_ids():
    fmt = ChatFormat(CharTokenizer(), "hermes")
    assert fmt.end_id == 2
    assert fmt.render([ChatMessage("user", "hi")]) == [1, 59, 80, 20, 21, 99, 39, 80]
    assert fmt.render([SYSTEM, USER, CALLING, RESULT], TOOLS) == [
        1, *chars("S:tools calc\nS:be brief\nU:1+2?\n"),
        *chars('A:ok<tool_call>{"name":"calc","arguments":{"x":"1+2"}}</tool_call>'), 2, *chars("T:3\nA:")]
    llama = ChatFormat(CharTokenizer(), "llama3")
    assert llama.render([USER, CALLING], add_generation_prompt=False) == [
        1, *chars('U:1+2?\nA:ok{"name":"calc","parameters":{"x":"1+2"}}'), 2]
    assert fmt.first_prompt([USER], TOOLS) == [1, *chars("S:tools calc\nU:1+2?\nA:")]


def test_tiny_format_names_a_character_outside_the_alphabet():
    with pytest.raises(ValueError, match="'é'"):
        ChatFormat(CharTokenizer(), "hermes").render([ChatMessage("user", "café")])


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return load_tokenizer(write_qwen_tokenizer(tmp_path_factory.mktemp("qwen")))


QWEN_TOOLS_SYSTEM = (
    "<|im_start|>system\nbe brief\n\n# Tools\n\nYou are provided with function signatures within <tools></tools> "
    "XML tags:\n<tools>\n" + json.dumps({"type": "function", "function": {
        "name": "calc", "description": "adds", "parameters": TOOLS[0].parameters}}) +
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n")


def test_hf_format_renders_openai_dicts_through_the_template(qwen):
    fmt = ChatFormat(qwen, "hermes")
    assert fmt.end_id == qwen.encode("<|im_end|>")[0]
    ids = fmt.render([SYSTEM, USER, CALLING, RESULT], TOOLS)
    assert qwen.decode(ids, skip_special=False) == QWEN_TOOLS_SYSTEM + (
        "<|im_start|>user\n1+2?<|im_end|>\n"
        '<|im_start|>assistant\nok\n<tool_call>\n{"name": "calc", "arguments": {"x": "1+2"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert qwen.decode(fmt.render([USER], (), False), skip_special=False) == (
        "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\n1+2?<|im_end|>\n")  # tools=None
    assert qwen.chat("hi") == qwen.decode(fmt.render([ChatMessage("user", "hi")]), skip_special=False)


# What the model writes for CALLING and ANSWER: the tiny format's text, and Qwen's
# template's text after "<|im_start|>assistant\n".
OUTPUTS = {"tiny": ('ok<tool_call>{"name":"calc","arguments":{"x":"1+2"}}</tool_call>', "It is 3."),
           "qwen": ('ok\n<tool_call>\n{"name": "calc", "arguments": {"x": "1+2"}}\n</tool_call>', "It is 3.")}


@pytest.mark.parametrize("kind", ["tiny", "qwen"])
@pytest.mark.parametrize("ended", [(True, True), (False, True), (True, False), (False, False)],
                         ids=["ended", "cut-ended", "ended-cut", "cut-cut"])
def test_recorded_ids_plus_continuations_are_the_full_rendering(kind, ended, qwen):
    """Token in, token out: the first prompt, then per turn the model's output ids (with
    the end id if it produced one) and the continuation, equal the conversation's
    rendering whenever the output is the text the format would re-render."""
    tok = CharTokenizer() if kind == "tiny" else qwen
    fmt = ChatFormat(tok, "hermes")
    history = [SYSTEM, USER]
    recorded = fmt.first_prompt(history, TOOLS)
    turns = [(CALLING, OUTPUTS[kind][0], [RESULT]), (ANSWER, OUTPUTS[kind][1], [THANKS])]
    for (reply, output, new), done in zip(turns, ended):
        recorded += tok.encode(output) + ([fmt.end_id] if done else [])
        history.append(reply)
        cont = fmt.continuation(history, new, TOOLS, done)
        assert (cont[0] == fmt.end_id) != done
        recorded += cont
        history += new
        assert recorded == fmt.render(history, TOOLS, True)


def tokenizer_with(folder, template):
    """The Qwen-style tokenizer with another chat template (None: none)."""
    folder = write_qwen_tokenizer(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return load_tokenizer(folder)


THINK_DROPPING = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and not loop.last %}"
                  "{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""Drops an older assistant turn's thinking, as Qwen3's template does."""


def test_continuation_counts_end_ids_not_a_byte_equal_prefix(tmp_path):
    fmt = ChatFormat(tokenizer_with(tmp_path, THINK_DROPPING), "hermes")
    history = [USER, ChatMessage("assistant", "<think>easy</think>It is 3.")]
    prefix, full = fmt.render(history, (), False), fmt.render([*history, THANKS])
    assert full[:len(prefix)] != prefix  # the last turn re-rendered without its thinking
    cont = fmt.continuation(history, [THANKS], (), True)
    assert fmt.tokenizer.decode(cont, skip_special=False) == (
        "\n<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\n")


def test_continuation_errors(tmp_path):
    fmt = ChatFormat(CharTokenizer(), "hermes")
    with pytest.raises(ValueError, match="must end with the assistant's turn"):
        fmt.continuation([USER], [THANKS], (), True)
    plain = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"  # no end token
    no_end = ChatFormat(tokenizer_with(tmp_path / "a", plain), "hermes")
    with pytest.raises(ValueError, match="0 end ids where the history has 0"):
        no_end.continuation([USER, ANSWER], [THANKS], (), True)
    with pytest.raises(ValueError, match="the tokenizer has no chat_template"):
        ChatFormat(tokenizer_with(tmp_path / "b", None), "hermes").render([USER])
