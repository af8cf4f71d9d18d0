#!/usr/bin/env python3
"""Generates src/tokenizer/unicode_data.inc: the Unicode data lily's tokenizer needs to match the reference
`tokenizers` library (the npm oracle in tests/oracle) exactly.

Two tables, and why:
1. Regex classes. The reference pre-tokenizer regex runs on Oniguruma with Unicode 16 tables; lily
   runs it on PCRE2 10.42 (Debian 12), whose tables are Unicode 14 (the same version as this Python's
   unicodedata). The additions are the code points the oracle counts as \\p{L}, \\p{M}, \\p{N} or \\s that
   PCRE2 does not; \\s is given in full (PCRE2's \\s also has U+180E). They are measured by probing the oracle itself (every code point, one Split regex per
   class), so the table is what the reference does, not what a newer Unicode says.
2. NFC data. The reference normaliser (unicode-normalization-alignments) uses Unicode 9.0 data: characters
   assigned later are inert (ccc 0, no decomposition). Canonical properties of assigned characters never
   change, so Unicode 14 data (unicodedata) restricted to code points present in 9.0 (Perl's Present_In) is
   exactly the Unicode 9.0 data.

Run from the repository root after `npm ci` in tests/oracle:  python3 tools/gen_unicode_tables.py
Needs python3 (unicodedata 14.0), perl, node.
"""
import json
import os
import subprocess
import sys
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "src", "tokenizer", "unicode_data.inc")
assert unicodedata.unidata_version == "14.0.0", "PCRE2 10.42 uses Unicode 14.0.0; run with a Python that does too"

PROBE_JS = r"""
const tk = require('@anush008/tokenizers');
function splitter(re) {
  const j = {version: "1.0", truncation: null, padding: null, added_tokens: [], normalizer: null,
    pre_tokenizer: {type: "Split", pattern: {Regex: re}, behavior: "Removed", invert: false},
    post_processor: null, decoder: null, model: {type: "BPE", dropout: null, unk_token: null,
      continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false,
      vocab: {a: 0}, merges: []}};
  return tk.Tokenizer.fromString(JSON.stringify(j)).getPreTokenizer();
}
const out = {};
for (const [name, re] of [['L', '\\p{L}'], ['M', '\\p{M}'], ['N', '\\p{N}'], ['s', '\\s']]) {
  const p = splitter(re);
  const member = new Uint8Array(0x110000).fill(1);
  for (let lo = 0; lo < 0x110000; lo += 0x4000) {
    let s = '';
    for (let c = lo; c < lo + 0x4000; c++) if (c < 0xD800 || c > 0xDFFF) s += String.fromCodePoint(c);
    for (const [piece] of p.preTokenizeString(s)) for (const ch of piece) member[ch.codePointAt(0)] = 0;
  }
  for (let c = 0xD800; c <= 0xDFFF; c++) member[c] = 0;
  out[name] = [];
  for (let c = 0; c < 0x110000; c++) if (member[c]) out[name].push(c);
}
console.log(JSON.stringify(out));
"""


def oracle_classes():
    env = dict(os.environ, NODE_PATH=os.path.join(ROOT, "tests", "oracle", "node_modules"))
    out = subprocess.run(["node", "-e", PROBE_JS], env=env, check=True, capture_output=True, text=True).stdout
    return {k: set(v) for k, v in json.loads(out).items()}


def pcre2_classes():
    cat = {c: unicodedata.category(chr(c)) for c in range(0x110000)}
    return {
        "L": {c for c, k in cat.items() if k[0] == "L"},
        "M": {c for c, k in cat.items() if k[0] == "M"},
        "N": {c for c, k in cat.items() if k[0] == "N"},
        # PCRE2 with UCP: \s is \p{Z} plus HT, LF, VT, FF, CR.
        "s": {c for c, k in cat.items() if k[0] == "Z"} | set(range(9, 14)),
    }


def present_in_9():
    script = ('for my $c (0..0x10FFFF) { next if $c >= 0xD800 && $c <= 0xDFFF; '
              'print "$c\\n" if chr($c) =~ /\\p{Present_In: 9.0}/ }')
    out = subprocess.run(["perl", "-e", script], check=True, capture_output=True, text=True).stdout
    return {int(x) for x in out.split()}


def ranges(cps):
    rs = []
    for c in sorted(cps):
        if rs and rs[-1][1] == c - 1:
            rs[-1][1] = c
        else:
            rs.append([c, c])
    return rs


def emit_ranges(name, cps, comment):
    body = ", ".join(f"{{0x{a:X}, 0x{b:X}}}" for a, b in ranges(cps))
    return f"// {comment}\ninline constexpr CpRange {name}[] = {{{body}}};\n"


def main():
    oracle, pcre = oracle_classes(), pcre2_classes()
    parts = []
    for key, name in (("L", "kExtraLetter"), ("M", "kExtraMark"), ("N", "kExtraNumber")):
        missing = pcre[key] - oracle[key]
        if missing:
            sys.exit(f"PCRE2 counts {len(missing)} code points as {key} that the oracle does not "
                     f"(e.g. U+{min(missing):04X}); additions cannot express that")
        extra = oracle[key] - pcre[key]
        parts.append(emit_ranges(name, extra, f"oracle \\{'s' if key == 's' else 'p{' + key + '}'} minus PCRE2 10.42: "
                                 f"{len(extra)} code points"))
    # PCRE2's \s also matches U+180E (its \h list), which the oracle does not: \s is written out in full.
    parts.append(emit_ranges("kWhiteSpace", oracle["s"], f"oracle \\s (White_Space): {len(oracle['s'])} code points"))
    present = present_in_9()
    ccc = []
    decomp = []
    for c in sorted(present):
        ch = chr(c)
        k = unicodedata.combining(ch)
        if k:
            if ccc and ccc[-1][1] == c - 1 and ccc[-1][2] == k:
                ccc[-1][1] = c
            else:
                ccc.append([c, c, k])
        d = unicodedata.decomposition(ch)
        if d and not d.startswith("<") and not (0xAC00 <= c <= 0xD7A3):
            seq = [int(x, 16) for x in d.split()]
            assert len(seq) in (1, 2) and all(x in present for x in seq)
            composes = len(seq) == 2 and unicodedata.normalize("NFC", chr(seq[0]) + chr(seq[1])) == ch
            decomp.append((c, seq[0], seq[1] if len(seq) == 2 else 0, int(composes)))
    body = ", ".join(f"{{0x{a:X}, 0x{b:X}, {k}}}" for a, b, k in ccc)
    parts.append(f"// canonical combining classes != 0 (Unicode 9.0): {len(ccc)} runs\n"
                 f"inline constexpr CccRange kCcc[] = {{{body}}};\n")
    body = ", ".join(f"{{0x{c:X}, 0x{a:X}, 0x{b:X}, {m}}}" for c, a, b, m in decomp)
    parts.append(f"// canonical decompositions, one level (Unicode 9.0, Hangul excluded): {len(decomp)} entries;\n"
                 f"// composes = 1 when the pair recomposes under NFC (not excluded, not a singleton)\n"
                 f"inline constexpr Decomp kDecomp[] = {{{body}}};\n")
    with open(OUT, "w") as f:
        f.write("// Generated by tools/gen_unicode_tables.py (see its docstring for the sources); do not edit.\n"
                "// Included by src/tokenizer/unicode.cpp only.\n")
        for p in parts:
            f.write(p)
    print(f"wrote {OUT}: {len(ccc)} ccc runs, {len(decomp)} decompositions")


if __name__ == "__main__":
    main()
