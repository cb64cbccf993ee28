// The Rust side of scripts/bench_tokenizer.sh: Hugging Face's `tokenizers` (npm package, the
// Rust library compiled) encodes the same chunks one after the other; prints the same JSON line
// as bench_tokenizer. Usage: node bench/tokenizer_rust.js TOKENIZER.json CHUNKS.jsonl
'use strict';
const fs = require('fs');
const { Tokenizer } = require('tokenizers');

(async () => {
  const [file, chunksPath] = process.argv.slice(2);
  const t0 = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(file);
  const loadS = Number(process.hrtime.bigint() - t0) / 1e9;
  const chunks = fs.readFileSync(chunksPath, 'utf8').split('\n').filter((l) => l.length > 0)
    .map((l) => JSON.parse(l));
  const bytes = chunks.reduce((n, c) => n + Buffer.byteLength(c, 'utf8'), 0);
  let hash = 1469598103934665603n;
  const mask = (1n << 64n) - 1n;
  let tokens = 0;
  const idsAll = [];
  const t1 = process.hrtime.bigint();
  for (const c of chunks) idsAll.push((await tok.encode(c, null, { addSpecialTokens: false })).getIds());
  const sSeq = Number(process.hrtime.bigint() - t1) / 1e9;
  // one encodeBatch call (RAYON_NUM_THREADS=1 keeps it on one thread): no per-call overhead of
  // the Node binding; the faster of the two is reported, to be fair to the Rust library
  const t2 = process.hrtime.bigint();
  const batch = await tok.encodeBatch(chunks, { addSpecialTokens: false });
  const sBatch = Number(process.hrtime.bigint() - t2) / 1e9;
  if (batch.length !== chunks.length) throw new Error('encodeBatch returned a different count');
  const s = Math.min(sSeq, sBatch);
  for (const ids of idsAll) {  // hashed outside the timed loop (BigInt arithmetic is slow)
    tokens += ids.length;
    for (const id of ids) hash = ((hash ^ BigInt(id)) * 1099511628211n) & mask;
  }
  console.log(JSON.stringify({ library: 'huggingface tokenizers (Rust, npm ' +
      require('tokenizers/package.json').version + ')', bytes, chunks: chunks.length, tokens,
    seconds: Number(s.toFixed(4)), seconds_per_call: Number(sSeq.toFixed(4)),
    seconds_batch: Number(sBatch.toFixed(4)), mb_per_s: Number((bytes / 1e6 / s).toFixed(3)),
    load_seconds: Number(loadS.toFixed(3)), ids_fnv1a: hash.toString(16).padStart(16, '0') }));
})().catch((e) => { console.error(e); process.exit(1); });
