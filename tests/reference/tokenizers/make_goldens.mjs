// The tokenizer goldens (see make_goldens.sh, which runs this):
//   node make_goldens.mjs text                 prints the text the base tokenizers are trained on
//   node make_goldens.mjs goldens WORK OUT     writes OUT/<variant>.json and OUT/goldens.json
//   node make_goldens.mjs chat TOKENIZER CONVERSATIONS OUT
//                                              renders each conversation with Ling's chat template in
//                                              Hugging Face's Jinja engine, encodes it, writes OUT
// goldens.json: {"texts": [...], "tokenizers": {"<variant>.json": {"ids": [[...] per text],
// "decoded": [text per text]}}}, encoded with special tokens split out and no post-processing
// (add_special_tokens false), as lingtrain's encode_with_special_tokens does.
import fs from "node:fs";
import path from "node:path";
import { Template } from "@huggingface/jinja";
import { Tokenizer } from "@huggingface/tokenizers";

// Ling's chat template (Hugging Face's for inclusionAI/Ling-lite: role lower-cased, user -> HUMAN, then
// upper-cased, no separator between turns) with LLaMA-Factory's efficient_eos for training: the end
// token after each assistant reply. Observation turns come from "observation" or TRL's "tool" role.
const LING_TRAINING_TEMPLATE =
  "{%- for message in messages -%}" +
  "{%- set role = message['role'] | lower -%}" +
  "{%- if role == 'user' -%}{%- set role = 'human' -%}{%- endif -%}" +
  "{%- if role == 'tool' -%}{%- set role = 'observation' -%}{%- endif -%}" +
  "{{- '<role>' + (role | upper) + '</role>' + message['content'] -}}" +
  "{%- if role == 'assistant' -%}{{- eos_token -}}{%- endif -%}" +
  "{%- endfor -%}" +
  "{%- if add_generation_prompt -%}{{- '<role>ASSISTANT</role>' -}}{%- endif -%}";

// TRL's record forms as one message list.
function messagesOf(record) {
  if (record.messages) return record.messages;
  const part = (value, role) => (typeof value === "string" ? [{ role, content: value }] : value);
  return [...part(record.prompt, "user"), ...part(record.completion, "assistant")];
}

// Text with what tokenizers get wrong: Unicode of several scripts, combining marks, emoji sequences,
// digits in runs, contractions in both cases, every kind of whitespace run, and special tokens.
const TEXTS = [
  "Hello world",
  "The quick brown fox jumps over the lazy dog.",
  " leading space and trailing space ",
  "I'm sure you're right; they'll see it's what we've said, he'd say. DON'T SHOUT, I'M HERE.",
  "Numbers: 7, 42, 365, 2026, 1234567890, 3.14159, -0.5e-3, 1,000,000 and v2.0.1",
  "2026-11-23T20:07:32Z",
  "multiple   spaces\tand\t\ttabs",
  "line one\nline two\n\nafter a blank line\r\nwindows line\n",
  "trailing newlines\n\n\n",
  "          ten spaces then text",
  "                                                  ",
  "Grüße aus München — ça va? naïve café, Ærøskøbing, Łódź",
  "Привет, мир! Как дела?",
  "日本語のテキストと中文文本，还有标点。",
  "한국어 문장도 있습니다.",
  "مرحبا بالعالم",
  "emoji 🙂🚀 mixed with text 👍🏽 and a family 👩‍👩‍👧",
  "combining: e\u0301 a\u0308 n\u0303 (decomposed) vs é ä ñ (composed)",
  "def square(x):\n    return x ** 2  # the square\n\nprint(square(12))",
  "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
  "{\"name\": \"lookup\", \"arguments\": {\"entity\": \"Paris\", \"relation\": \"capital_of\"}}",
  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
  "<role>SYSTEM</role>You are a helpful assistant<role>HUMAN</role>Hi!<role>ASSISTANT</role>Hello.<|endoftext|>",
  "a<|endoftext|>b<|endoftext|><|endoftext|>c",
  "spaces around <|endoftext|> a special token",
  "tool call <|tool|> with spaces   <|tool|>   around",
  "the word lingtrain is an added token: lingtrain, lingtrains",
  "<role",
  "<|endoftext",
  "",
];

// The training text: the test texts and more of each kind, with varied numbers, repeated so that
// merges of every kind are learned.
function trainingText() {
  const lines = [];
  const words = ["model", "training", "expert", "router", "token", "attention", "gradient", "loss", "layer", "batch"];
  for (let i = 0; i < 400; ++i) {
    const w = words[i % words.length], v = words[(i * 7) % words.length];
    lines.push(`The ${w} and the ${v} at step ${i * 37} took ${(i * 1.37).toFixed(2)} ms; it's ${i % 3 ? "fine" : "NOT fine"}.`);
    if (i % 5 === 0) lines.push(`Über ${w}: größer, schöner — café ${i}. Привет ${v}, мир ${i}. 日本語${i}と中文${i}。`);
    if (i % 7 === 0) lines.push(`def f${i}(x):\n    return x * ${i} + ${i % 9}  # ${w}\n`);
    if (i % 11 === 0) lines.push(`{"name": "lookup", "arguments": {"entity": "${w}", "relation": "${v}_of"}} 🙂 🚀`);
  }
  // Made-up words from syllables (a fixed linear congruential sequence), so that merges go deep.
  const syllables = ["ka", "lo", "mi", "ren", "sta", "tor", "ul", "ve", "xis", "zen", "qu", "ph", "ang", "eer"];
  let state = 12345;
  const next = () => (state = (state * 1103515245 + 12345) % 2147483648) % syllables.length;
  for (let i = 0; i < 600; ++i) {
    const word = () => syllables[next()] + syllables[next()] + (i % 3 ? syllables[next()] : "");
    lines.push(`${word()} ${word()} ${word()}, ${word()}'s ${word()} ${i % 2 ? "and" : "or"} ${word().toUpperCase()}.`);
  }
  return TEXTS.join("\n") + "\n" + lines.join("\n") + "\n";
}

function writeJson(file, value) {
  fs.writeFileSync(file, JSON.stringify(value, null, 1) + "\n");
}

// Variants of the trained tokenizers, each exercising one more part of the tokenizer.json format.
function variants(work) {
  const read = (name) => JSON.parse(fs.readFileSync(path.join(work, name), "utf8"));
  const result = {};
  result["ling.json"] = read("ling.json");
  result["llama3.json"] = read("llama3.json");
  // GPT-2's form: ByteLevel with its own regex, and merges written as pairs (the newer format).
  const gpt2 = read("gpt2.json");
  gpt2.model.merges = gpt2.model.merges.map((m) => m.split(" "));
  result["gpt2.json"] = gpt2;
  // ByteLevel adding a prefix space (GPT-2's original setting).
  const prefix = read("gpt2.json");
  prefix.pre_tokenizer.add_prefix_space = true;
  result["gpt2_prefix_space.json"] = prefix;
  // Llama-3's ignore_merges: a piece found whole in the vocabulary is taken as it is.
  const ignore = read("llama3.json");
  ignore.model.ignore_merges = true;
  result["llama3_ignore_merges.json"] = ignore;
  // Added tokens: a special one that strips the whitespace on both sides, and a plain (not special) one.
  const added = read("ling.json");
  const next = Math.max(...added.added_tokens.map((t) => t.id)) + 1;
  added.added_tokens.push({ id: next, content: "<|tool|>", single_word: false, lstrip: true, rstrip: true, normalized: false, special: true });
  added.added_tokens.push({ id: next + 1, content: "lingtrain", single_word: false, lstrip: false, rstrip: false, normalized: false, special: false });
  result["ling_added_tokens.json"] = added;
  return result;
}

const [mode, work, out] = process.argv.slice(2);
if (mode === "text") {
  process.stdout.write(trainingText());
} else if (mode === "goldens") {
  const goldens = { texts: TEXTS, tokenizers: {} };
  for (const [name, json] of Object.entries(variants(work))) {
    writeJson(path.join(out, name), json);
    const tokenizer = new Tokenizer(json, {});
    const ids = TEXTS.map((text) => tokenizer.encode(text, { add_special_tokens: false }).ids);
    const decoded = ids.map((list) =>
      list.length ? tokenizer.decode(list, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "");
    goldens.tokenizers[name] = { ids, decoded };
  }
  writeJson(path.join(out, "goldens.json"), goldens);
} else if (mode === "chat") {
  const [tokenizerPath, conversationsPath, outPath] = process.argv.slice(3);
  const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(tokenizerPath, "utf8")), {});
  const template = new Template(LING_TRAINING_TEMPLATE);
  const records = fs
    .readFileSync(conversationsPath, "utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => {
      const text = template.render({ messages: messagesOf(JSON.parse(line)), eos_token: "<|endoftext|>", add_generation_prompt: false });
      return { text, ids: tokenizer.encode(text, { add_special_tokens: false }).ids };
    });
  writeJson(outPath, { template: LING_TRAINING_TEMPLATE, tokenizer: path.basename(tokenizerPath), records });
} else {
  console.error("usage: make_goldens.mjs text | goldens WORK OUT | chat TOKENIZER CONVERSATIONS OUT");
  process.exit(1);
}
