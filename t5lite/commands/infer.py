"""`t5lite infer`: decode text with a workdir's checkpoint."""

import json
import sys

import jax
import numpy as np

from t5lite import config as config_lib
from t5lite import files
from t5lite import outputs as outputs_lib
from t5lite.data import vocabulary
from t5lite.models import decoding, family
from t5lite.train import mesh as mesh_lib
from t5lite.train import run as run_lib


def read_inputs(texts: list[str], input_file: str | None = None, key: str = 'input') -> list[str]:
  """The `--input` texts, then one per line of input_file (of a .jsonl file, each line's `key`).

  An empty input is a ValueError that names it: a blank line is more likely a mistake than a
  request to decode nothing.
  """
  inputs = []
  for number, text in enumerate(texts, 1):
    if not text.strip():
      raise ValueError(f'--input number {number} is empty')
    inputs.append(text)
  if input_file:
    lines = files.read_text(input_file, '--input_file').split('\n')
    if lines[-1] == '':
      lines.pop()  # the file's last line ends in a newline
    if not lines:
      raise ValueError(f'--input_file: {input_file} is empty: give one input per line')
    for number, line in enumerate(lines, 1):
      text = line.rstrip('\r')
      if input_file.endswith('.jsonl') and text.strip():
        row = files.parse_json(text, f'{input_file} line {number}')
        text = row.get(key) if isinstance(row, dict) else None
        if not isinstance(text, str):
          raise ValueError(f'{input_file} line {number} is not a JSON object with a string '
                           f'"{key}" field')
      if not text.strip():
        raise ValueError(f'{input_file} line {number} is empty: give one input per line')
      inputs.append(text)
  if not inputs:
    raise ValueError('nothing to decode: give --input=TEXT or --input_file=FILE')
  return inputs


def encode_inputs(vocab: vocabulary.Vocabulary, inputs: list[str], length: int, *, eos: bool
                  ) -> np.ndarray:
  """(len(inputs), length) int32 ids, EOS appended if `eos`, 0-padded; length 0: the longest
  input's (a causal LM's rows have no inputs part, so its prompts are as long as they are). Longer
  inputs keep their first tokens, with one warning line each on stderr and a count after them."""
  encoded = [vocab.encode(text) for text in inputs]
  length = length or max(len(ids) + eos for ids in encoded)
  tokens = np.zeros((len(inputs), length), np.int32)
  truncated = 0
  for row, ids in enumerate(encoded):
    room = length - eos
    if len(ids) > room:
      truncated += 1
      print(f'warning: input {row + 1} has {len(ids) + eos} tokens, more than '
            f'data.inputs_length={length}; keeping the first {room}'
            f'{" and EOS" if eos else ""}', file=sys.stderr)
      ids = ids[:room]
    ids += [vocabulary.EOS_ID] * eos
    tokens[row, :len(ids)] = ids
  if truncated:
    print(f'warning: truncated {truncated} of {len(inputs)} inputs', file=sys.stderr)
  return tokens


def infer_workdir(config, workdir: str, inputs: list[str], *, step: int | None = None,
                  out: str | None = None, overwrite: bool = False,
                  max_decode_length: int | None = None, seed: int = 0, **options) -> list[str]:
  """Decoded text of each input (sentinels shown as <extra_id_N>) with checkpoint `step`
  (default: the latest) of `workdir`; `out` also gets them as JSONL {"input": .., "output": ..}.

  Inputs are tokenized with the run's vocabulary, EOS appended for an encoder, and padded to
  data.inputs_length (a causal LM's: to the longest). `options` go to `decoding.generate`
  (method, temperature, top_k, top_p, beam_size, alpha); max_decode_length defaults to
  data.targets_length; sampling draws from `seed`. Which `out` may be written, checked before
  anything is decoded: t5lite/outputs.py.
  """
  keys = ('input', 'output')  # of each JSONL line
  if out:
    outputs_lib.check_file(out, lambda path: outputs_lib.is_jsonl_of(path, keys),
                           workdir=workdir, overwrite=overwrite)
  model_cfg = config_lib.model_config(config)
  vocab = vocabulary.load_vocabulary(config.data.vocabulary)
  tokens = encode_inputs(vocab, inputs, config.data.inputs_length,
                         eos=family(model_cfg.arch).prompt == 'encoder')
  max_decode_length = max_decode_length or config.data.targets_length
  decoding.check_options(model_cfg, tokens.shape[1], max_decode_length=max_decode_length,
                         **options)
  rng = jax.random.key(seed)
  run = run_lib.make_run(config)
  _, params = run.restore_params(workdir, step)
  # Fixed-size batches (one compilation), split over the mesh's batch axes.
  shards = mesh_lib.batch_shards(run.mesh, run.rules)
  batch_size = -(-min(len(inputs), config.data.batch_size) // shards) * shards
  tokens = np.pad(tokens, ((0, -len(inputs) % batch_size), (0, 0)))
  decoded = []
  with run.sharding():
    model = run.model(params)
    for start in range(0, len(tokens), batch_size):
      batch = jax.device_put(tokens[start:start + batch_size], run.batch_sharding)
      decoded.extend(jax.device_get(decoding.generate(
          model, batch, max_decode_length=max_decode_length,
          rng=jax.random.fold_in(rng, start), **options)))
  outputs = [vocab.decode(row) for row in decoded[:len(inputs)]]
  if out:
    with outputs_lib.writing(out) as temp, open(temp, 'w', encoding='utf-8') as f:
      for row in zip(inputs, outputs):
        f.write(json.dumps(dict(zip(keys, row))) + '\n')
  return outputs
