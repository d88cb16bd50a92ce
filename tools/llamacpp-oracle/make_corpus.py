#!/usr/bin/env python3
"""Write the tokenizer corpus (tests/data/llamacpp/corpus.json): deterministic, stdlib only.

Each entry is {"cat": CATEGORY, "text": S} or, for byte strings that are not valid UTF-8 (JSON
cannot carry them), {"cat": CATEGORY, "hex": LOWERCASE_HEX_OF_THE_BYTES}.
usage: python3 make_corpus.py OUT.json
"""

import json
import random
import sys


def prose():
    return [
        "Hello world", "Hello, world!", "hello world", "HELLO WORLD", " Hello world",
        "The quick brown fox jumps over the lazy dog.",
        "It was the best of times, it was the worst of times.",
        "A man, a plan, a canal: Panama!", "e.g. i.e. etc. vs. Mr. Mrs. Dr.",
        "Don't stop believing.", "What's up?", "Supercalifragilisticexpialidocious",
        "antidisestablishmentarianism", "pneumonoultramicroscopicsilicovolcanoconiosis",
        "a", "I", "x y z", "?", "!!!", "...", "—", "--", "a-b_c.d/e\\f", "CamelCaseIdentifier",
        "snake_case_identifier", "SCREAMING_SNAKE", "kebab-case-word", "email@example.com",
        "https://example.com/path?query=1&x=y#frag", "C:\\Program Files\\duet\\bin",
        "(parentheses) [brackets] {braces} <angles>", "\"double\" 'single' `back`",
        "#hashtag @mention $dollar %percent ^caret &amp *star", "~tilde |pipe +plus =equals",
        "1st 2nd 3rd 4th", "O'Reilly's book", "rock 'n' roll", "''", "'", "\"",
        "Ünïcödé façade naïve café résumé", "Straße groß", "Ωmega αβγ", "ﬁ ligature ﬂ",
        "ſ long s", "İstanbul ı", "ǅ titlecase", "µ micro", "½ ¼ ¾", "™ © ®",
        "The year 2024 was a leap year.", "Temperature: -3.5°C", "Price: $1,299.99",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.",
    ]


def whitespace():
    out = []
    for n in (1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 32):
        out.append(" " * n)
    for n in (1, 2, 3, 4, 8):
        out += ["\t" * n, "\n" * n, "\r\n" * n]
    out += ["\r", "\r\r\n", "\n\r", "\v", "\f", "\u00a0", "\u2003", "\u3000", "\u200b",
            " \t \n", "\t \n ", "\n \n", " \n\n ", "a  b", "a   b", "a\tb", "a\t\tb", "a\nb",
            "a\n\nb", "a \nb", "a\n b", "a \n b", " a", "  a", "   a", "a ", "a  ", "a   ",
            "  leading", "trailing  ", "  both  ", "\nleading newline", "trailing newline\n",
            "\n\n\nthree newlines first", "line1\nline2\nline3", "line1\r\nline2\r\n",
            "tab\tseparated\tvalues", "    four-space indent", "\tindent tab",
            "word \n\n\n word", "x \t\n\r y", "  \n  \n  ", "end with spaces   \n", "é  é",
            "中 文", "中  文", "1 2  3   4", "!  !", "a\u00a0b", "a\u3000b"]
    return out


def numbers():
    rng = random.Random(18)
    out = []
    for n in range(1, 21):
        out.append("".join(str((i * 7 + n) % 10) for i in range(n)).lstrip("0") or "0")
        out.append(str(rng.randrange(10 ** (n - 1), 10 ** n)))
        out.append(f"x{'9' * n}y")
        out.append(f" {'1' * n}")
    out += ["0", "00", "007", "0.5", "3.14159265358979", "-42", "+42", "1e10", "6.02e23",
            "1,000", "1,000,000", "12,345,678.90", "1.000.000,00", "1 000 000", "1_000_000",
            "0x1F", "0b1010", "0o777", "192.168.0.1", "2001:db8::1", "2024-01-31",
            "12:34:56", "+1 (555) 123-4567", "50%", "$100", "€100", "¥100", "3/4", "1:2",
            "v1.2.3", "a1b2c3", "123abc", "abc123", "١٢٣", "१२३", "一二三", "①②③", "Ⅻ",
            "２０２４", "3.", ".5", "1..2", "10^6", "2**10"]
    return out


def code():
    return [
        "int main(void) { return 0; }",
        "#include <stdio.h>\nint main() {\n    printf(\"hi\\n\");\n}\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
        "x->y = *p++; a[i] <<= 2; b != c && d || !e;",
        "def f(x):\n    return x ** 2\n", "class A(B):\n    def __init__(self):\n        pass\n",
        "lambda x: x+1", "print(f\"{name!r:>10}\")", "import numpy as np\nnp.zeros((3, 4))",
        "if __name__ == \"__main__\":\n    main()", "# comment\n\n\n    indented = True",
        '{"key": "value", "n": 1, "list": [1, 2, 3], "nested": {"a": null}}',
        '[{"id":1},{"id":2}]', '{\n  "a": true,\n  "b": false\n}',
        "#!/bin/sh\nset -eu\nfor f in *.txt; do echo \"$f\"; done",
        "ls -la | grep foo > out.txt 2>&1 &", "cd /tmp && make -j$(nproc)",
        "export PATH=\"$HOME/bin:$PATH\"", "SELECT * FROM users WHERE id = 1;",
        "<div class=\"x\">Hello</div>", "<html><body></body></html>",
        "fn main() { println!(\"hi\"); }", "let x: Vec<u8> = vec![];",
        "const f = (a, b) => a ?? b;", "std::vector<std::string> v{\"a\"};",
        "a == b != c <= d >= e", "i++ --j", "/* block */ // line", "x = y if z else w",
        "    ", "\t\tif (x) {", "}}}}", "))))", "[[[[", ";;;;", "====", "----", "____", "****",
        "~~~~", "<<<<", ">>>>", "::", "->", "=>", "|>", "<|", "<=>", "...", "`code`",
        "```python\nprint(1)\n```",
    ]


def scripts():
    return [
        "中文", "你好，世界！", "我爱自然语言处理。", "日本語のテキストです。", "ひらがな カタカナ",
        "한국어 텍스트", "안녕하세요", "繁體中文測試", "𠀀𠀁 (CJK Extension B)", "漢字かな交じり文",
        "مرحبا بالعالم", "العربية لغة جميلة", "السلام عليكم ورحمة الله", "مرحبا 123 world",
        "नमस्ते दुनिया", "हिन्दी भाषा", "क्षत्रिय", "Привет, мир!", "Москва — столица России.",
        "Ёжик в тумане", "Γειά σου κόσμε", "שלום עולם", "ไทย ภาษา", "Tiếng Việt có dấu",
        "ქართული", "Հայերեն", "தமிழ்", "বাংলা", "ગુજરાતી", "ಕನ್ನಡ", "മലയാളം", "සිංහල",
        "ᚠᛇᚻ runes", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math", "𝟘𝟙𝟚", "Ελληνικά και English mixed",
        "混合 mixed テキスト text", "Ответ: 42", "e = mc² ∑∫∂√∞≠≈", "→ ← ↑ ↓ ⇒", "♠♣♥♦",
        "░▒▓█", "┌─┐│└┘", "①②③④", "㎞ ㎏ ㏄",
    ]


def emoji():
    return [
        "😀", "😀😃😄", "Hello 👋 world 🌍", "👍🏻👍🏼👍🏽👍🏾👍🏿", "👨‍👩‍👧‍👦", "👩‍💻", "🏳️‍🌈",
        "🏴‍☠️", "🇺🇸🇬🇧🇯🇵", "🇩🇪", "❤️", "❤", "☺️", "✔️✅", "🤷‍♀️", "🧑🏽‍🚀", "1️⃣2️⃣#️⃣",
        "🫠🫡🫶", "🐈‍⬛", "🏃🏾‍♂️‍➡️", "🤖 🚀 🔥", "emoji at end 🎉", "🎉 emoji at start",
        "x😀y", "😀 😀  😀", "🙂\n🙃", "🇦", "🇦🇧🇨", "🏴󠁧󠁢󠁳󠁣󠁴󠁿",
    ]


def combining():
    return [
        "e\u0301", "cafe\u0301", "n\u0303", "a\u0308o\u0308u\u0308", "\u0301 leading mark",
        "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u0334\u0335\u031c\u0330\u0354\u036bL\u0328\u0337\u0345\u0320\u032cG\u0335O",
        "\u1100\u1161\u11a8", "\u0915\u094d\u0937", "\u0627\u064e\u0644\u0652", "o\u0338",
        "\u00e9 vs e\u0301", "\u212b vs \u00c5 vs A\u030a", "\ufb01", "\u1e9b\u0323",
        "a\u200db", "a\u200cb", "a\u2060b", "\ufeffBOM at start", "mid\ufeffBOM",
        "\u202eRTL override\u202c", "\u200fRLM", "i\u0307", "\u0130", "x\u20ddy",
    ]


def contractions():
    out = []
    for w in ("s", "t", "re", "ve", "m", "ll", "d"):
        for form in (w, w.upper(), w.capitalize()):
            out.append(f"it'{form}")
            out.append(f"I'{form} here")
    out += ["don't DON'T Don't", "we'LL they'Ll", "she'S HE'S", "'s", "'S", "'ll", " 's",
            "'s'", "''s", "rock'n'roll", "can't won't shan't", "y'all", "it’s (curly)",
            "O'Neil's", "'t is", "'Tis the season", "'quoted'", "word'", "'word"]
    return out


SPECIAL_TEXTS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>",
                 "</s>", "<unk>", "<|reserved_special_token_0|>", "<think>", "</think>",
                 "<tool_call>", "<|fim_prefix|>", "[INST]", "<start_of_turn>"]


def specials():
    out = []
    for t in SPECIAL_TEXTS:
        out += [t, f"a{t}b", f" {t} ", f"{t}{t}", f"\n{t}\n", f"text {t}"]
    out += ["<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
            "<|eot_id" , "<|eot_id|", "|eot_id|>", "<|EOT_ID|>", "< |eot_id| >", "<<|eot_id|>>",
            "<|im_start|><|im_end|><|endoftext|>", "<s>[INST] hi [/INST]", "<<SYS>>\nsys\n<</SYS>>",
            "<|unknown_token|>", "<|", "|>", "<||>", "<s >", "< s>"]
    return out


def invalid_utf8():
    # (bytes) sequences around the edges of UTF-8: lone continuation bytes, truncated
    # multi-byte sequences, overlong forms, surrogates, out-of-range code points.
    seqs = [b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xc2", b"\xe2\x82", b"\xe2\x82\xac",
            b"\xf0\x9f\x98", b"\xf0\x9f\x98\x80", b"\xed\xa0\x80", b"\xed\xbf\xbf",
            b"\xf4\x90\x80\x80", b"\xf5", b"\xff", b"\xfe\xff", b"\xe0\x80\xaf", b"\xf8\x88\x80\x80\x80"]
    out = []
    for s in seqs:
        out += [s, b"a" + s + b"b", s + s, b"hello " + s, s + b" world", b"\xe4\xb8\xad" + s]
    out += [b"valid \xe4\xb8\xad\xe6\x96\x87 then \x80 invalid", b"\x00", b"a\x00b",
            b"\x01\x02\x03\x1f\x7f"]
    return out


def main():
    out_path = sys.argv[1]
    entries = []
    for cat, fn in (("prose", prose), ("whitespace", whitespace), ("numbers", numbers),
                    ("code", code), ("scripts", scripts), ("emoji", emoji),
                    ("combining", combining), ("contractions", contractions),
                    ("special", specials)):
        for s in fn():
            entries.append({"cat": cat, "text": s})
    for b in invalid_utf8():
        try:
            entries.append({"cat": "utf8-edge", "text": b.decode("utf-8")})
        except UnicodeDecodeError:
            entries.append({"cat": "utf8-edge", "hex": b.hex()})
    # long mixed strings: several categories glued, to exercise long pre-tokenizer runs
    rng = random.Random(6)
    pool = [e["text"] for e in entries if "text" in e]
    for _ in range(40):
        entries.append({"cat": "mixed", "text": "".join(rng.choice(pool) for _ in range(8))})
    seen, unique = set(), []
    for e in entries:
        key = e.get("text", "hex:" + e.get("hex", ""))
        if key not in seen:
            seen.add(key)
            unique.append(e)
    doc = {"about": "duet tokenizer corpus; made by tools/llamacpp-oracle/make_corpus.py. "
                    "An entry's 'hex' holds bytes that are not valid UTF-8.",
           "strings": unique}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{len(unique)} strings", file=sys.stderr)


if __name__ == "__main__":
    main()
