NUM_GPUS = 0

import pytest

from dynarl.components.agents.messages import ToolCall
from dynarl.components.agents.tool_calls import ParsedReply, call_text, parse_reply, parser_for

CALC = ToolCall("call_0", "calc", '{"x": "1+2"}')
SEARCH = ToolCall("call_1", "search", '{"q": "café; bar", "n": 3}')


@pytest.mark.parametrize("text, content, calls", [
    ('<tool_call>{"name": "calc", "arguments": {"x": "1+2"}}</tool_call>', "", (CALC,)),
    ('<tool_call>\n  {"name": "calc",\n "arguments": {"x": "1+2"}}\n</tool_call>\n', "", (CALC,)),
    ('<tool_call>{"name":"calc","arguments":{"x":"1+2"}}</tool_call>\n'
     '<tool_call>{"name":"search","arguments":{"q":"café; bar","n":3}}</tool_call>', "", (CALC, SEARCH)),
    ('Let me add.\n<tool_call>{"name": "calc", "arguments": {"x": "1+2"}}</tool_call>\n', "Let me add.", (CALC,)),
    ('a <tool_call>{"name": "calc", "arguments": {"x": "1+2"}}</tool_call> b', "a  b", (CALC,)),
    ('<tool_call>{"name": "calc", "arguments": "{\\"x\\": \\"1+2\\"}"}</tool_call>', "", (CALC,)),
    ("  The answer is 3.  ", "The answer is 3.", ()),
    ("", "", ()),
])
def test_hermes_parses(text, content, calls):
    assert parse_reply(text, "hermes") == ParsedReply(content, calls, None)


@pytest.mark.parametrize("text, reason", [
    ('ok <tool_call>{"name": "calc", "arguments": {}}', "unclosed <tool_call>"),
    ('<tool_call>{"name": "calc", "arguments": {}</tool_call>', "invalid JSON"),
    ('<tool_call>["calc"]</tool_call>', "not a JSON object"),
    ('<tool_call>{"arguments": {"x": 1}}</tool_call>', "no 'name'"),
    ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', "no 'name'"),
    ('<tool_call>{"name": "calc"}</tool_call>', "no 'arguments'"),
    ('<tool_call>{"name": "calc", "arguments": [1]}</tool_call>', "'arguments' is not an object"),
    ('<tool_call>{"name": "calc", "arguments": "x=1"}</tool_call>', "not JSON"),
    ('<tool_call>{"name": "calc", "arguments": "[1]"}</tool_call>', "'arguments' is not an object"),
    ('<tool_call>{"name": "calc", "arguments": {}}</tool_call><tool_call>{"name": "calc"}</tool_call>',
     "no 'arguments'"),
])
def test_hermes_malformed_keeps_the_whole_text(text, reason):
    parsed = parse_reply(text, "hermes")
    assert (parsed.content, parsed.calls) == (text, ())
    assert reason in parsed.malformed


@pytest.mark.parametrize("text, content, calls", [
    ('{"name": "calc", "parameters": {"x": "1+2"}}', "", (CALC,)),
    ('<|python_tag|>{"name": "calc", "parameters": {"x": "1+2"}}', "", (CALC,)),
    ('\n <|python_tag|> {"name": "calc", "arguments": {"x": "1+2"}} \n', "", (CALC,)),
    ('{"name": "calc", "parameters": "{\\"x\\": \\"1+2\\"}"}', "", (CALC,)),
    ('{"name": "calc", "parameters": {"x": "1+2"}}; {"name": "search", "parameters": {"q": "café; bar", "n": 3}}',
     "", (CALC, SEARCH)),
    ('{"name": "calc", "parameters": {"x": "1+2"}};', "", (CALC,)),
    ("The answer is {3}. ", "The answer is {3}.", ()),
    ("", "", ()),
])
def test_llama3_parses(text, content, calls):
    assert parse_reply(text, "llama3") == ParsedReply(content, calls, None)


@pytest.mark.parametrize("text, reason", [
    ('{"name": "calc", "parameters": {"x": 1}', "invalid JSON"),
    ('{"name": "calc", "parameters": {"x": 1}} and more', "text after a call"),
    ('{"name": "calc", "parameters": {}}; nope', "invalid JSON"),
    ('{"parameters": {}}', "no 'name'"),
    ('{"name": "calc"}', "no 'parameters'"),
    ('{"name": "calc", "parameters": 7}', "not an object"),
    ("<|python_tag|>brave_search.call(query='x')", "not followed by a JSON object"),
])
def test_llama3_malformed_keeps_the_whole_text(text, reason):
    parsed = parse_reply(text, "llama3")
    assert (parsed.content, parsed.calls) == (text, ())
    assert reason in parsed.malformed


def test_call_ids_take_the_prefix():
    text = '<tool_call>{"name":"a","arguments":{}}</tool_call><tool_call>{"name":"b","arguments":{}}</tool_call>'
    assert [c.id for c in parse_reply(text, "hermes", id_prefix="s7_t2").calls] == ["s7_t2_0", "s7_t2_1"]


def test_call_text_is_compact():
    assert call_text(CALC, "hermes") == '<tool_call>{"name":"calc","arguments":{"x":"1+2"}}</tool_call>'
    assert call_text(CALC, "llama3") == '{"name":"calc","parameters":{"x":"1+2"}}'
    with pytest.raises(ValueError, match="'call_9': arguments are not JSON"):
        call_text(ToolCall("call_9", "calc", "{x"), "hermes")


@pytest.mark.parametrize("parser", ["hermes", "llama3"])
@pytest.mark.parametrize("calls", [(CALC,), (CALC, SEARCH), (ToolCall("call_0", "noop", "{}"),)])
def test_call_text_round_trips(parser, calls):
    joiner = "" if parser == "hermes" else ";"
    assert parse_reply(joiner.join(call_text(c, parser) for c in calls), parser) == ParsedReply("", calls, None)


@pytest.mark.parametrize("template, configured, parser", [
    (None, "auto", "hermes"),
    ("{{ '<|im_start|>' }}<tool_call>", "auto", "hermes"),
    ("{{- '<|python_tag|>' }}", "auto", "llama3"),
    ("{%- if message.role == 'ipython' %}", "auto", "llama3"),
    ("{{- '<|python_tag|>' }}", "hermes", "hermes"),
    (None, "llama3", "llama3"),
])
def test_parser_for(template, configured, parser):
    assert parser_for(template, configured) == parser


def test_parser_for_rejects_unknown_names():
    with pytest.raises(ValueError, match="'auto', 'hermes', 'llama3'.*'mistral'"):
        parser_for(None, "mistral")
    with pytest.raises(ValueError, match="parser must be one of"):
        parse_reply("x", "mistral")
