// The JavaScript reference for BpeTokenizer: @lenml/tokenizers (a port of
// Hugging Face tokenizers, from transformers.js) installed by ./tandem in
// tests/tools/node_modules.
//
//   node bpe_reference.js encode MODEL_DIR CORPUS.json
//       CORPUS.json: a JSON array of strings. Prints, one line per string,
//       {"ids": [...], "decoded": "...", "nfc": "..."}: its ids (no special
//       tokens added), the ids decoded again (skip_special_tokens, no
//       clean-up of spaces) and the string in NFC.
//   node bpe_reference.js bench MODEL_DIR TEXT_FILE SECONDS
//       Encodes the file's text repeatedly for about SECONDS and prints
//       {"bytes": N, "seconds": S, "mb_per_s": R} (after one warm-up pass).
//
// MODEL_DIR holds tokenizer.json and tokenizer_config.json.
"use strict";
const fs = require("fs");
const path = require("path");
const { TokenizerLoader } = require(path.join(__dirname, "../../tools/node_modules/@lenml/tokenizers"));

function load(dir) {
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  return TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
}

function encode(tok, text) {
  return tok.encode(text, { add_special_tokens: false });
}

const [mode, dir, file, seconds] = process.argv.slice(2);
const tok = load(dir);
if (mode === "encode") {
  const corpus = JSON.parse(fs.readFileSync(file, "utf8"));
  const out = corpus.map((text) => {
    const ids = encode(tok, text);
    const decoded =
      ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
    return JSON.stringify({ ids, decoded, nfc: text.normalize("NFC") });
  });
  process.stdout.write(out.join("\n") + "\n");
} else if (mode === "bench") {
  const text = fs.readFileSync(file, "utf8");
  const bytes = Buffer.byteLength(text, "utf8");
  encode(tok, text);  // warm-up: JIT and the tokenizer's own word cache
  const limit = Number(seconds) * 1e3;
  let n = 0;
  const t0 = performance.now();
  let t = t0;
  do {
    encode(tok, text);
    ++n;
    t = performance.now();
  } while (t - t0 < limit);
  const s = (t - t0) / 1e3;
  process.stdout.write(JSON.stringify({ bytes: bytes * n, seconds: s, mb_per_s: (bytes * n) / s / 1e6 }) + "\n");
} else {
  process.stderr.write("usage: node bpe_reference.js encode MODEL_DIR CORPUS.json | bench MODEL_DIR TEXT_FILE SECONDS\n");
  process.exit(2);
}
