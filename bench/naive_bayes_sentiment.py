"""The baseline a fine-tuned model should beat on the bundled sentiment task: naive Bayes.

Multinomial naive Bayes over lowercased word unigrams and bigrams with add-one smoothing,
trained on the task's train split and scored on its held-out split (`t5lite.inputs.tasks`:
|score| >= 0.5, every id divisible by 10 held out), in plain Python. Prints one JSON line.

  .venv/bin/python bench/naive_bayes_sentiment.py
"""

import collections
import json
import math
import re

from t5lite.inputs import tasks

_WORD = re.compile(r"[a-z0-9']+")


def features(text: str) -> list[str]:
  """'A fine, fine film' -> ['a', 'fine', 'fine', 'film', 'a fine', 'fine fine', 'fine film']."""
  words = _WORD.findall(text.removeprefix(tasks.SENTIMENT_PREFIX).lower())
  return words + [f'{a} {b}' for a, b in zip(words, words[1:])]


def train(examples) -> tuple[dict, dict, set]:
  """(log prior per class, feature counts per class, vocabulary) of (text, label) examples."""
  counts = collections.defaultdict(collections.Counter)
  labels = collections.Counter()
  for text, label in examples:
    labels[label] += 1
    counts[label].update(features(text))
  vocabulary = set().union(*counts.values())
  prior = {label: math.log(n / sum(labels.values())) for label, n in labels.items()}
  return prior, counts, vocabulary


def predict(model, text: str) -> str:
  prior, counts, vocabulary = model

  def log_posterior(label):
    total = sum(counts[label].values()) + len(vocabulary)  # add-one smoothing
    return prior[label] + sum(math.log((counts[label][f] + 1) / total)
                              for f in features(text) if f in vocabulary)

  return max(prior, key=log_posterior)


def main():
  splits = tasks.sentiment_examples()
  model = train(splits['train'])
  held_out = splits['validation']
  correct = sum(predict(model, text) == label for text, label in held_out)
  majority = max(collections.Counter(label for _, label in held_out).values())
  print(json.dumps({'bench': 'naive_bayes_sentiment', 'features': 'word 1-2 grams',
                    'train_examples': len(splits['train']), 'held_out_examples': len(held_out),
                    'accuracy': round(correct / len(held_out), 4),
                    'majority_class_accuracy': round(majority / len(held_out), 4)}))


if __name__ == '__main__':
  main()
