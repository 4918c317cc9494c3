"""`t5lite prepare` of bytes against SentencePiece tokens on the same corpus, side by side.

  .venv/bin/python bench/byte_prepare.py [--gigabytes=0.25] [--repeats=3]

The byte vocabulary (`--vocabulary=bytes`, ByT5's) needs no model: a store of it holds the
documents' UTF-8 bytes themselves. This writes a corpus of --gigabytes of JSONL (bench/
corpus_store.py's: paragraphs of the bundled corpus), prepares it into a store with the bundled
SentencePiece vocabulary and into one of bytes, --repeats times each, alternating which goes
first, each a child process timed after its imports, and removes it all. It prints one JSON line:
the median seconds of each, the corpus's megabytes a second, tokens, and the ratio
SentencePiece's seconds / the bytes' (the target: at least 1), with the load average at the
start and the end.
"""

import argparse
import json
import os
import shutil
import statistics
import tempfile

import corpus_store

VOCABULARIES = ('bundled', 'bytes')


def main() -> None:
  flags = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  flags.add_argument('--gigabytes', type=float, default=0.25, help='size of the written corpus')
  flags.add_argument('--repeats', type=int, default=3, help='prepares of each vocabulary')
  args = flags.parse_args()
  load_before = os.getloadavg()[0]
  scratch = tempfile.mkdtemp(prefix='t5lite-byte-prepare-')
  try:
    text = os.path.join(scratch, 'text')
    os.mkdir(text)
    names = corpus_store.write_corpus(text, args.gigabytes)
    text_bytes = sum(os.path.getsize(n) for n in names)
    seconds, tokens = {v: [] for v in VOCABULARIES}, {}
    for repeat in range(args.repeats):
      for vocabulary in (VOCABULARIES if repeat % 2 == 0 else VOCABULARIES[::-1]):
        out = os.path.join(scratch, vocabulary)
        tokens[vocabulary], _, work = corpus_store.prepare(
            os.path.join(text, '*.jsonl'), out, vocabulary=vocabulary)
        seconds[vocabulary].append(work)
        shutil.rmtree(out)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  median = {v: statistics.median(s) for v, s in seconds.items()}
  print(json.dumps({
      'bench': 'byte_prepare', 'text_bytes': text_bytes, 'repeats': args.repeats,
      'tokens': {'sentencepiece': tokens['bundled'], 'bytes': tokens['bytes']},
      'prepare_s': {'sentencepiece': round(median['bundled'], 3),
                    'bytes': round(median['bytes'], 3)},
      'text_mb_per_s': {'sentencepiece': round(text_bytes / 1e6 / median['bundled'], 1),
                        'bytes': round(text_bytes / 1e6 / median['bytes'], 1)},
      'ratio': round(median['bundled'] / median['bytes'], 3), 'target': '>= 1',
      'load_average_start': round(load_before, 2), **corpus_store.machine()}), flush=True)


if __name__ == '__main__':
  main()
