"""A tiny TFDS dataset of random documents, built offline (the `tfds_dir` fixture prepares it)."""

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

WORDS = ('the whale ship sea captain mind letter house sister ball dance carriage harpoon '
         'congress nation people war peace union states money law year great').split()


def random_documents(count: int, seed: int = 0) -> list[str]:
  """Short documents of 5 to 60 random words, so that blocks hold many documents."""
  rng = np.random.default_rng(seed)
  return [' '.join(rng.choice(WORDS, rng.integers(5, 60))) + '.' for _ in range(count)]


class T5liteTestText(tfds.core.GeneratorBasedBuilder):
  """150 short documents (1 in 10 empty; about 90 examples of 64 inputs), or ('empty')
  200 documents without text."""

  VERSION = tfds.core.Version('1.0.0')
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name='short'), tfds.core.BuilderConfig(name='empty')]

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self, features=tfds.features.FeaturesDict(
            {'text': tfds.features.Text(), 'id': tf.int64}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {'train': self._generate_examples()}

  def _generate_examples(self):
    if self.builder_config.name == 'empty':
      documents = [''] * 200
    else:
      documents = [d if i % 10 else '' for i, d in enumerate(random_documents(150))]
    for i, text in enumerate(documents):
      yield i, {'text': text, 'id': i}
