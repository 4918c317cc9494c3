"""`t5lite tokenizer`: a SentencePiece vocabulary with T5's ids, trained on one corpus or a mixture.

One corpus (any number of --input files, read as one text) trains as T5's vocabularies are: every
sentence once, at the character coverage an English vocabulary needs (0.9999). A multilingual
vocabulary (mT5's) is trained on a mixture of corpora, each --input one language: its sentences
are sampled as mT5 samples its pretraining data, corpus i with probability proportional to
n_i ** alpha (n_i: its sentences; alpha 0.3 in mT5, 1 reads each corpus once), so that a small
language is not drowned by a large one, and at mT5's character coverage, 0.99999, so that the
rare characters of scripts with many (Chinese, Japanese) are pieces of their own rather than unk.

  t5lite tokenizer --input=en.jsonl --input=hi.jsonl --input=ru.jsonl --alpha=0.3 \
      --character_coverage=0.99999 --vocab_size=32000 --out=spm/
"""

import io
import os
import re
from typing import Sequence

import numpy as np
import sentencepiece as spm

from t5lite import outputs
from t5lite import paths
from t5lite.data.vocabulary import MODE_TOKENS, VOCAB_FILE
from t5lite.token_ids import EOS_ID, PAD_ID, UNK_ID

ENGLISH_COVERAGE = 0.9999  # T5's vocabularies
MULTILINGUAL_COVERAGE = 0.99999  # mT5's
# SentencePiece trains on "sentences" and skips long ones; whole speeches are single lines.
_SENTENCE_BREAK = re.compile(r'(?<=[.!?])\s+|\n\s*\n')


def train_tokenizer(inputs: str | Sequence[str], vocab_size: int = 8000, out_dir: str = '.',
                    text_key: str = 'text', overwrite: bool = False, *, alpha: float = 1.0,
                    character_coverage: float = ENGLISH_COVERAGE) -> str:
  """Trains a unigram SentencePiece model with T5's ids; returns the path of `vocab.model`.

  `inputs` are what `data.source` accepts ('bundled', .txt/.jsonl files or globs), each a corpus
  of the mixture that `alpha` (in (0, 1]) samples; `vocab_size` counts pieces, the three mode
  pieces among them: the vocabulary adds the 100 sentinels. Which `out_dir` may be written,
  checked before training, and how: t5lite/outputs.py.
  """
  if not 0 < alpha <= 1:
    raise ValueError(f'--alpha={alpha} must be in (0, 1]: 1 reads each --input once, toward 0 '
                     'they are read alike (mT5: 0.3)')
  if not 0 < character_coverage <= 1:
    raise ValueError(f'--character_coverage={character_coverage} must be in (0, 1] '
                     f'(English: {ENGLISH_COVERAGE}, many languages: {MULTILINGUAL_COVERAGE})')
  outputs.check_folder(out_dir, (VOCAB_FILE,), overwrite=overwrite)
  sentences = _sentences(inputs, text_key, alpha)
  model = io.BytesIO()
  spm.set_random_generator_seed(0)  # input sampling, for corpora above input_sentence_size
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences, model_writer=model, vocab_size=vocab_size,
        model_type='unigram', pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        # '▁[NLU]', not '[NLU]': SentencePiece's dummy prefix would make '[NLU]' two ids, ▁ [NLU],
        # and an HF export one (it matches '[NLU]' before its pre-tokenizer adds the ▁)
        user_defined_symbols=['\u2581' + mode for mode in MODE_TOKENS],
        character_coverage=character_coverage, max_sentence_length=16384,
        input_sentence_size=10_000_000, shuffle_input_sentence=True,
        num_threads=os.cpu_count(), minloglevel=2)
  except RuntimeError as error:  # e.g. "... Vocabulary size too high (50000). Please set it ..."
    raise ValueError(f'--vocab_size={vocab_size} does not fit --input {inputs}: '
                     f'{str(error).splitlines()[-1].split("] ")[-1]}') from None
  with outputs.writing(out_dir, folder=True) as temp:
    with open(os.path.join(temp, VOCAB_FILE), 'wb') as f:
      f.write(model.getvalue())
  return str(paths.path(out_dir) / VOCAB_FILE)


def _sentences(inputs: str | Sequence[str], text_key: str, alpha: float):
  """The sentences SentencePiece trains on: every one of `inputs` once (alpha 1), or each corpus
  sampled by `mixture_counts`."""
  from t5lite.data import sources  # TensorFlow's: a run that reads no text never loads it
  if alpha == 1:
    documents, _ = sources.read_documents(inputs, text_key, flag='--input')
    return (s for doc in documents for s in _split(doc))
  corpora = [inputs] if isinstance(inputs, str) else list(inputs)
  split = [[s for doc in sources.read_documents(corpus, text_key, flag='--input')[0]
            for s in _split(doc)] for corpus in corpora]
  counts = mixture_counts([len(corpus) for corpus in split], alpha)
  rng = np.random.default_rng(0)
  return (corpus[i] for corpus, count in zip(split, counts)
          for i in _draw(rng, len(corpus), count))


def _split(document: str) -> list[str]:
  return [s for s in _SENTENCE_BREAK.split(document) if s.strip()]


def mixture_counts(sizes: Sequence[int], alpha: float) -> list[int]:
  """How many sentences to take of corpora of `sizes`: as many in all as they hold, corpus i's
  share n_i ** alpha / sum_j n_j ** alpha (rounded): [900, 100], alpha 0.5 -> [750, 250]."""
  weights = np.power(np.asarray(sizes, np.float64), alpha)
  return np.rint(sum(sizes) * weights / weights.sum()).astype(int).tolist()


def _draw(rng: np.random.Generator, size: int, count: int) -> np.ndarray:
  """`count` indices into `size` sentences: each whole pass in a random order, then a random
  part of one, so a corpus sampled up repeats its sentences evenly."""
  passes, rest = divmod(count, size)
  return np.concatenate([rng.permutation(size) for _ in range(passes)]
                        + [rng.permutation(size)[:rest]]).astype(int)
