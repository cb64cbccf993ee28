// Writes roberta.details.json: golden ids for a RoBERTa-style tokenizer computed by Hugging Face's
// own Rust `tokenizers` library (through its Node bindings, npm package "tokenizers").
//
// No RoBERTa tokenizer ships in ../shared, so this one is RoBERTa's recipe on GPT-2's files:
// GPT-2's byte-level BPE (../shared/tokenizers/gpt2/{encoder.json,vocab.bpe}), RoBERTa's special
// tokens added after GPT-2's 50257 entries (<s> <pad> </s> <unk>, then <mask> with lstrip as
// roberta-base's tokenizer.json has it), the ByteLevel pre-tokenizer without a prefix space,
// RobertaProcessing (<s> A </s> and <s> A </s></s> B </s>) and the ByteLevel decoder.
//
// The tokenizer is written as a tokenizer.json and loaded by the Rust library itself
// (Tokenizer.fromString), which then serialises it back; the golden file keeps that
// serialisation without its vocabulary and merges ("skeleton"), and the tests rebuild the full
// tokenizer.json from the skeleton and GPT-2's files.
//
// Usage (from the repository root, with ../shared beside it):
//   mkdir -p /tmp/npmtok && (cd /tmp/npmtok && npm install tokenizers@0.23.2)
//   NODE_PATH=/tmp/npmtok/node_modules node tests/data/tokenizers/make_roberta_golden.js
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const { Tokenizer } = require('tokenizers');

const shared = path.resolve(__dirname, '../../../../shared');
const gpt2 = path.join(shared, 'tokenizers/gpt2');
const vocab = JSON.parse(fs.readFileSync(path.join(gpt2, 'encoder.json'), 'utf8'));
const merges = fs.readFileSync(path.join(gpt2, 'vocab.bpe'), 'utf8')
  .split('\n').filter((l, i) => l.length > 0 && !(i === 0 && l.startsWith('#version')));

const n = Object.keys(vocab).length;  // 50257
const special = (content, id, lstrip) => ({
  id, content, single_word: false, lstrip, rstrip: false, normalized: false, special: true,
});
const spec = {
  version: '1.0',
  truncation: null,
  padding: null,
  added_tokens: [special('<s>', n, false), special('<pad>', n + 1, false),
                 special('</s>', n + 2, false), special('<unk>', n + 3, false),
                 special('<mask>', n + 4, true)],
  normalizer: null,
  pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: { type: 'RobertaProcessing', sep: ['</s>', n + 2], cls: ['<s>', n],
                    trim_offsets: true, add_prefix_space: false },
  decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '',
           end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, ignore_merges: false,
           vocab, merges },
};
const tok = Tokenizer.fromString(JSON.stringify(spec));
const tmp = path.join(os.tmpdir(), 'roberta_tokenizer_rust.json');
tok.save(tmp, false);
const saved = JSON.parse(fs.readFileSync(tmp, 'utf8'));
const skeleton = { ...saved, model: { ...saved.model } };
delete skeleton.model.vocab;
delete skeleton.model.merges;

const fixtures = path.join(shared, 'fixtures/tokenizers');
const texts = JSON.parse(fs.readFileSync(path.join(fixtures, 'gpt2.details.json'), 'utf8'))
  .cases.map((c) => c.text)
  .concat(JSON.parse(fs.readFileSync(path.join(fixtures, 'llama3.details.json'), 'utf8'))
    .cases.slice(50).map((c) => c.text))
  .concat(['Hello <mask>!', 'The capital of France is <mask>.', 'a<mask>b  <mask>  c',
           '<s>A</s></s>B</s>', 'x <pad> y <unk> z', ' leading space', '<mask>']);
const pairs = [['Hello world', 'How are you?'], ['', 'only b'], ['only a', ''],
               ['The cat <mask> on the mat.', 'A dog was there.'],
               ['don\'t stop', '  spaced   out  ']];

(async () => {
  const cases = [];
  for (const text of texts) {
    const e = await tok.encode(text, null, { addSpecialTokens: true });
    const ids = e.getIds();
    const plain = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
    cases.push({
      text, ids, tokens: e.getTokens(), type_ids: e.getTypeIds(), ids_no_special: plain,
      decoded: await tok.decode(ids, false), decoded_skip_special: await tok.decode(ids, true),
    });
  }
  const pair_cases = [];
  for (const [a, b] of pairs) {
    const e = await tok.encode(a, b, { addSpecialTokens: true });
    pair_cases.push({ a, b, ids: e.getIds(), type_ids: e.getTypeIds() });
  }
  const out = {
    meta: {
      library: `Hugging Face tokenizers (Rust) through its Node bindings: npm "tokenizers" ` +
        `${require('tokenizers/package.json').version}, node ${process.version}`,
      recipe: 'GPT-2 encoder.json/vocab.bpe + RoBERTa special tokens and post-processor; see ' +
        'make_roberta_golden.js',
      ids: 'encode(text, null, {addSpecialTokens: true}).getIds()',
      ids_no_special: 'encode(text, null, {addSpecialTokens: false}).getIds()',
      decoded: 'decode(ids, false) (no clean-up)',
      decoded_skip_special: 'decode(ids, true)',
      pairs: 'encode(a, b, {addSpecialTokens: true}): ids and type ids',
    },
    skeleton,
    cases,
    pairs: pair_cases,
  };
  fs.writeFileSync(path.join(__dirname, 'roberta.details.json'), JSON.stringify(out, null, 1) + '\n');
  console.log(`wrote ${cases.length} cases and ${pair_cases.length} pairs`);
})().catch((e) => { console.error(e); process.exit(1); });
