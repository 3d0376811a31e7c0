"""Two tokenizers with one small interface: `encode`, `decode`, `pad_id`, `bos_id`,
`eos_id`, `vocab_size`.

- CharTokenizer: one id per character, for the built-in tasks and the tiny models
  (ids 0/1/2 are pad/bos/eos, then the alphabet).
- HFTokenizer: wraps the `tokenizers` library when a model folder has tokenizer.json.
"""
from __future__ import annotations

import datetime
import json
import string
from pathlib import Path

CHAR_TOKENIZER_FILE = "char_tokenizer.json"
DEFAULT_ALPHABET = string.printable  # 100 characters; with 3 specials it fits vocab 128


class CharTokenizer:
    pad_id, bos_id, eos_id = 0, 1, 2
    num_special = 3
    chat_template = None
    max_chars_per_token = 1

    def __init__(self, alphabet: str = DEFAULT_ALPHABET):
        if len(set(alphabet)) != len(alphabet):
            raise ValueError("alphabet must not repeat a character")
        if not alphabet:
            raise ValueError("alphabet must not be empty")
        self.alphabet = alphabet
        self._ids = {ch: i + self.num_special for i, ch in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet) + self.num_special

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        try:
            ids = [self._ids[ch] for ch in text]
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the tokenizer's alphabet") from None
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        out = []
        for i in ids:
            if i >= self.num_special:
                out.append(self.alphabet[i - self.num_special])
            elif not skip_special:
                out.append(("<pad>", "<bos>", "<eos>")[i])
        return "".join(out)

    def save(self, folder: str | Path) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / CHAR_TOKENIZER_FILE).write_text(json.dumps({"alphabet": self.alphabet}))


class HFTokenizer:
    """tokenizer.json through `tokenizers`; special ids from tokenizer_config.json when
    present, else from the usual special token strings."""

    _candidates = {"bos": ("<|im_start|>", "<s>", "<bos>", "<|begin_of_text|>"),
                   "eos": ("<|im_end|>", "<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>"),
                   "pad": ("<|endoftext|>", "<pad>", "[PAD]")}

    def __init__(self, folder: str | Path):
        from tokenizers import Tokenizer  # (a core dependency; imported here: only HF folders need it)

        folder = Path(folder)
        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        named: dict[str, str | None] = {}
        config_path = folder / "tokenizer_config.json"
        self.chat_template: str | None = None
        """The model's chat template (jinja): tokenizer_config.json's chat_template, or
        chat_template.jinja beside it (where newer transformers save it)."""
        if config_path.is_file():
            config = json.loads(config_path.read_text())
            for kind in ("bos", "eos", "pad"):
                value = config.get(f"{kind}_token")
                named[kind] = value.get("content") if isinstance(value, dict) else value
            template = config.get("chat_template")
            if isinstance(template, list):  # named templates: the default one
                template = next((t.get("template") for t in template if t.get("name") == "default"), None)
            self.chat_template = template if isinstance(template, str) else None
        if self.chat_template is None and (folder / "chat_template.jinja").is_file():
            self.chat_template = (folder / "chat_template.jinja").read_text()
        self._chat_render = None
        self._max_chars_per_token: int | None = None
        self.bos_id = self._find("bos", named.get("bos"))
        self.eos_id = self._find("eos", named.get("eos"))
        pad = self._find("pad", named.get("pad"))
        self.pad_id = pad if pad is not None else self.eos_id

    def _find(self, kind: str, name: str | None) -> int | None:
        for token in ((name,) if name else self._candidates[kind]):
            token_id = self._tok.token_to_id(token)
            if token_id is not None:
                return token_id
        return None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def max_chars_per_token(self) -> int:
        """The most characters of a text one token can stand for: its longest vocabulary
        entry (a byte-level entry's characters are bytes, at least the text's characters),
        times 4 where a normalizer may compose characters (NFC joins up to four into one).
        A normalizer or pre-tokenizer that deletes characters outright is not counted."""
        if self._max_chars_per_token is None:
            longest = max(map(len, self._tok.get_vocab(with_added_tokens=True)), default=1)
            self._max_chars_per_token = longest * (4 if self._tok.normalizer is not None else 1)
        return self._max_chars_per_token

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """add_bos: a BOS first, unless the text begins with one (a chat-formatted prompt does)."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if not add_bos or self.bos_id is None or ids[:1] == [self.bos_id]:
            return ids
        return [self.bos_id, *ids]

    def chat(self, text: str) -> str:
        """`text` as the user's message, formatted by the model's chat template with the
        assistant's turn opened (what transformers' apply_chat_template(...,
        add_generation_prompt=True) renders)."""
        return self.render_chat([{"role": "user", "content": text}], None, True)

    def render_chat(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool) -> str:
        """OpenAI-style message dicts (and tool dicts, or None) through the model's chat
        template, in a sandboxed jinja environment set up as transformers sets its own
        (its tojson: no HTML escaping, keys in order), so the text is what the model saw
        in training."""
        if self.chat_template is None:
            raise ValueError("the tokenizer has no chat_template")
        if self._chat_render is None:  # compiled once: a dataset formats every row with it
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise ValueError(f"chat template: {message}")

            def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
                return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                                  sort_keys=sort_keys)
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
            env.filters["tojson"] = tojson
            env.globals["raise_exception"] = raise_exception
            # Llama 3.x templates print today's date
            env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
            self._chat_render = env.from_string(self.chat_template).render
        special = {f"{kind}_token": self._tok.id_to_token(i) if i is not None else ""
                   for kind, i in (("bos", self.bos_id), ("eos", self.eos_id), ("pad", self.pad_id))}
        return self._chat_render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                 **special)

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)


def load_tokenizer(folder: str | Path) -> CharTokenizer | HFTokenizer:
    """tokenizer.json -> HFTokenizer; char_tokenizer.json -> its CharTokenizer."""
    folder = Path(folder)
    if (folder / "tokenizer.json").is_file():
        return HFTokenizer(folder)
    if (folder / CHAR_TOKENIZER_FILE).is_file():
        return CharTokenizer(json.loads((folder / CHAR_TOKENIZER_FILE).read_text())["alphabet"])
    raise FileNotFoundError(f"no tokenizer.json or {CHAR_TOKENIZER_FILE} in {folder}")


def chat_formatter(tokenizer: CharTokenizer | HFTokenizer):
    """The tokenizer's `chat` when it has a chat template, else None (task.dataset.chat)."""
    return tokenizer.chat if tokenizer.chat_template is not None else None
