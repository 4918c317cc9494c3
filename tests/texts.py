"""Small made-up texts for tests that train: tokenized in no time, unlike the bundled corpus."""

import pathlib

import numpy as np

WORDS = 'the sea ship captain mind letter house sister ball dance carriage nation people'.split()


def random_corpus(path) -> str:
  """40 documents of 40 random words, as a .txt source; returns the path."""
  rng = np.random.default_rng(1)
  pathlib.Path(path).write_text('\n\n'.join(' '.join(rng.choice(WORDS, 40)) for _ in range(40)),
                                encoding='utf-8')
  return str(path)


def keyword_task(path, count: int = 800) -> str:
  """A two-class .tsv task: 'yes' if the 3 to 8 words include 'whale', else 'no'; half of each."""
  rng = np.random.default_rng(0)
  lines = ['input\ttarget']
  for i in range(count):
    words = list(rng.choice(WORDS, rng.integers(3, 9)))
    if i % 2:
      words[rng.integers(len(words))] = 'whale'
    lines.append(f'{" ".join(words)}\t{"yes" if i % 2 else "no"}')
  pathlib.Path(path).write_text('\n'.join(lines) + '\n', encoding='utf-8')
  return str(path)
