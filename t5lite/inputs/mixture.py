"""A mixture's schedule: which component each packed row comes from, and which of its examples.

  segment = resumed_segment({'books': 1, 'web': 2}, position, row)  # {'books': 341, 'web': 683}
  segment.schedule.component[t]  # the component of cycle position t (sorted by name: books 0)
  segment.schedule.rank[t]       # that component's rows before t in the cycle

`data.mixture` names components, each a source (or token store; data's if left out) with a
weight, and optionally its own objective and that objective's settings (UL2's denoisers are
seven components of one source: t5lite/objectives/ul2.py). Rates are in rows
(one example per packed row, so in tokens). The weights become integer rows per cycle of L rows
(largest remainder; L = 1024, doubled until every component has a row), and one cycle is laid
out by smooth weighted round-robin (nginx's): every position adds each component's rows to its
credit and takes the component of most credit, which pays L. So every prefix of a cycle, and any
window of rows, holds each component within about one row of its share, not the ±sqrt(n) of
sampling rows i.i.d.; and row r of a segment is component[r % L], that component's example
(r // L) * rows_c + rank[r % L] (t5lite/inputs/pipeline.py computes it in TF): O(1), stateless,
the same on any process count.

Each component is indexed as a single source is (t5lite/inputs/pipeline.py): its example j is chunk
index_shuffle(j mod N_c) of its epoch j // N_c, keyed by (seed, component name).

The weights are the components' own (`data.mixture_rule='weights'`), or their sizes to a power
(`'size'`: mT5's language sampling, component i with probability proportional to n_i ** alpha,
n_i the train tokens its token store's manifests count, alpha `data.mixture_alpha`: 1 samples
in proportion to size, toward 0 every component alike; a component's weight, 1 if left out,
multiplies its rate). The stores' sizes do not change, so a resumed run gets the same rows per
cycle and the same schedule (`component_weights`, `describe`).

Reweighting. A pipeline's position (`state()`, saved per process in checkpoints) holds, besides
`batch`, the schedule segment in force: the row it started at, each component's rows per cycle,
and each component's examples consumed before that row. A resume with the same rows per cycle
keeps the segment; with other weights, or another set of components, a new segment starts at the
resume row, every component continuing at its next example (a new one at its first, a removed
one forgotten). So a component is never replayed nor skipped by a change of weights.
"""

import math
import os
import sys

import ml_collections
import numpy as np

from t5lite import objectives
from t5lite import paths

RULES = ('weights', 'size')  # data.mixture_rule: the components' weights, or by their sizes
FIRST_CYCLE = 1024  # rows of the shortest cycle; doubled while a component would get none
MAX_CYCLE = 1 << 20  # longest cycle: a weight below 1/MAX_CYCLE of the total is refused
ROW = 'segment_row'  # position keys: the segment's first row, and per component:
ROWS_PER_CYCLE = 'rows_per_cycle.'  # + name: its rows in each cycle
EXAMPLES = 'examples.'  # + name: its examples consumed before the segment's first row


# A mixture component's settings and their types: what it reads, its weight, and its objective's
# (objectives.SETTINGS); those left out are data's (its source too).
COMPONENT_SETTINGS = {'source': str, 'weight': float, 'text_key': str,
                      'validation_fraction': float, **objectives.SETTINGS}


def check_rule(data: ml_collections.ConfigDict) -> None:
  """Refuses, in one line, a mixture rule that is none or an alpha outside (0, 1]."""
  if data.mixture_rule not in RULES:
    raise ValueError(f'config.data.mixture_rule={data.mixture_rule!r} is not one of '
                     f'{", ".join(RULES)}')
  if not 0 < data.mixture_alpha <= 1:
    raise ValueError(f'config.data.mixture_alpha={data.mixture_alpha} must be in (0, 1]: 1 '
                     'samples components in proportion to their sizes, toward 0 alike (mT5: 0.3)')
  if data.mixture_rule == 'size' and not data.mixture:
    raise ValueError("config.data.mixture_rule='size' weighs a mixture's components; "
                     'give them in config.data.mixture')
  check_components(data.mixture, weighed=data.mixture_rule == 'weights')


def check_components(components: ml_collections.ConfigDict, weighed: bool = True) -> None:
  """Refuses, in one line naming it, a component that cannot be mixed; its objective is checked
  with the model's (`components`, `check_objectives`). A component needs a weight where the rule
  is the weights (`weighed`); else one left out is 1."""
  for name, component in components.items():
    where = f'config.data.mixture.{name}'
    if not name or '.' in name:
      raise ValueError(f'config.data.mixture: a component name must be a non-empty word, '
                       f'got {name!r}')
    if not isinstance(component, ml_collections.ConfigDict):
      raise ValueError(f'{where} must be a ConfigDict of {", ".join(COMPONENT_SETTINGS)}')
    unknown = sorted(set(component) - set(COMPONENT_SETTINGS))
    if unknown:
      raise ValueError(f'unknown setting {where}.{unknown[0]}; a component takes '
                       f'{", ".join(COMPONENT_SETTINGS)}')
    weight = component.get('weight', None if weighed else 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not (
        0 < weight <= sys.float_info.max):  # not inf, nor nan, nor an int past every float
      raise ValueError(f'{where}.weight={weight!r} must be a positive finite number')
    for setting, what in (('source', 'a source or a token store'), ('objective', 'an objective')):
      if setting in component and not (isinstance(component[setting], str)
                                       and component[setting]):
        raise ValueError(f"{where}.{setting} must name {what}, or be left out (data's)")
    fraction = component.get('validation_fraction', 0.0)
    if not 0 <= fraction < 1:
      raise ValueError(f'{where}.validation_fraction={fraction} must be in [0, 1)')
    objectives.check_settings(component, where)


def components(data: ml_collections.ConfigDict) -> list[tuple[str, ml_collections.ConfigDict,
                                                               objectives.Objective]]:
  """A mixture's components sorted by name, each (name, its data settings: `component_data`,
  its objective). One line, naming the component, for an objective that is unknown, does not
  read a setting the component sets, computes another loss than data.objective's or does not
  make its features at the run's lengths."""
  main = objectives.get(data.objective)
  declared, listed = main.features(data), []
  for name in sorted(data.mixture):
    where = f'data.mixture.{name}'
    view = component_data(data, name)
    if view.objective not in objectives.OBJECTIVES:
      raise ValueError(f'{where}.objective={view.objective!r} is not one of '
                       f'{", ".join(objectives.OBJECTIVES)}')
    objective = objectives.OBJECTIVES[view.objective]
    own = set(data.mixture[name]) & set(objectives.SETTINGS) - {'objective'}
    objectives.check_reads(view, sorted(own | set(objectives.set_mode(view))), objective, where)
    if type(objective).loss is not type(main).loss:
      raise ValueError(f'{where}.objective={objective.name!r} computes another loss than '
                       f'data.objective={main.name!r}; a mixture trains one loss')
    features = objective.features(view)
    if features != declared:
      differ = sorted(set(features.items()) ^ set(declared.items()))[0][0]
      raise ValueError(f'{where}.objective={objective.name!r} makes other features than '
                       f'data.objective={main.name!r} at the run\'s lengths ({differ}); every '
                       'component must give the same')
    listed.append((name, view, objective))
  return listed


def check_objectives(config: ml_collections.ConfigDict, model_cfg) -> None:
  """Each component's objective against the run's model and settings, as `objectives.for_run`
  checks data.objective's: one line naming the component."""
  if not config.data.get('mixture'):
    return
  for name, _, objective in components(config.data):
    try:
      objective.check(config, model_cfg)
    except ValueError as error:
      raise ValueError(f'data.mixture.{name}: {error}') from None


def component_data(data: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  """`data` as component `name` reads it: a single source, the component's settings over data's."""
  view = ml_collections.ConfigDict(data.to_dict())
  view.mixture = ml_collections.ConfigDict()
  for setting, value in data.mixture[name].items():
    if setting != 'weight':
      view[setting] = value
  return view


def rows_per_cycle(weights: dict[str, float]) -> dict[str, int]:
  """Weights -> integer rows per cycle by largest remainder, the cycle the shortest power of two
  from FIRST_CYCLE that gives every component a row: {'a': 1, 'b': 2} -> {'a': 341, 'b': 683}."""
  names = sorted(weights)
  # Scaled by a power of two, which is exact, so that their sum is finite (two weights of 1e308)
  # and the shares are those of the weights as given, bit for bit.
  exponent = math.frexp(max(weights.values()))[1]
  scaled = {n: math.ldexp(weight, -exponent) for n, weight in weights.items()}
  shares = np.array([scaled[n] for n in names], np.float64) / sum(scaled.values())
  cycle = FIRST_CYCLE
  while cycle * shares.min() < 1:
    cycle *= 2
    if cycle > MAX_CYCLE:
      smallest = names[int(shares.argmin())]
      raise ValueError(f'data.mixture.{smallest}.weight is below 1/{MAX_CYCLE:,} of the total '
                       'weight; raise it or leave the component out')
  ideal = shares * cycle
  rows = np.floor(ideal).astype(np.int64)
  by_remainder = sorted(range(len(names)), key=lambda c: (rows[c] - ideal[c], c))
  for c in by_remainder[:cycle - rows.sum()]:
    rows[c] += 1
  return {n: int(r) for n, r in zip(names, rows)}


class Schedule:
  """One cycle of rows laid out by smooth weighted round-robin; components sorted by name."""

  def __init__(self, rows: dict[str, int]):
    self.names = sorted(rows)
    self.rows = np.array([rows[n] for n in self.names], np.int64)
    self.cycle = int(self.rows.sum())
    self.component = np.empty(self.cycle, np.int32)  # the component of each cycle position
    credit = np.zeros(len(self.names), np.int64)
    for t in range(self.cycle):
      credit += self.rows
      chosen = int(credit.argmax())  # ties: the first by name
      credit[chosen] -= self.cycle
      self.component[t] = chosen
    self.rank = np.empty(self.cycle, np.int64)  # rows of its component before t in the cycle
    for c in range(len(self.names)):
      where = np.flatnonzero(self.component == c)
      self.rank[where] = np.arange(where.size)

  def rows_before(self, row: int) -> np.ndarray:
    """Rows of each component among the schedule's first `row` rows."""
    return (row // self.cycle) * self.rows + np.bincount(
        self.component[:row % self.cycle], minlength=len(self.names))


class Segment:
  """The schedule in force from row `start` on, and each component's examples before it."""

  def __init__(self, rows: dict[str, int], start: int = 0, examples: dict[str, int] | None = None):
    self.schedule = Schedule(rows)
    self.start = start
    self.examples = np.array([(examples or {}).get(n, 0) for n in self.schedule.names], np.int64)

  def position(self) -> dict[str, int]:
    """The segment as position keys (ints, as a checkpoint holds them)."""
    names = self.schedule.names
    return {ROW: self.start,
            **{ROWS_PER_CYCLE + n: int(r) for n, r in zip(names, self.schedule.rows)},
            **{EXAMPLES + n: int(e) for n, e in zip(names, self.examples)}}

  def examples_before(self, row: int) -> dict[str, int]:
    """Each component's examples consumed before global row `row` (at or after `start`)."""
    consumed = self.examples + self.schedule.rows_before(row - self.start)
    return {n: int(e) for n, e in zip(self.schedule.names, consumed)}


def is_position_key(key: str) -> bool:
  return key == ROW or key.startswith((ROWS_PER_CYCLE, EXAMPLES))


def resumed_segment(weights: dict[str, float], position: dict, row: int) -> Segment:
  """The segment to read global row `row` on with: the saved one in `position` if the weights
  give its rows per cycle, else a new one from `row` that continues every component."""
  rows = rows_per_cycle(weights)
  if ROW not in position:  # a fresh run, or a batch number: the schedule from row 0
    return Segment(rows)
  saved = Segment({k[len(ROWS_PER_CYCLE):]: v for k, v in position.items()
                   if k.startswith(ROWS_PER_CYCLE)}, position[ROW],
                  {k[len(EXAMPLES):]: v for k, v in position.items() if k.startswith(EXAMPLES)})
  if dict(zip(saved.schedule.names, saved.schedule.rows.tolist())) == rows:
    return saved
  return Segment(rows, row, saved.examples_before(row))


def component_weights(data: ml_collections.ConfigDict) -> dict[str, float]:
  """Each component's weight by data.mixture_rule: its own, or (`size`) its own (1 if left
  out) times its store's train tokens ** data.mixture_alpha."""
  given = {name: component.get('weight', 1.0) for name, component in data.mixture.items()}
  if data.mixture_rule == 'weights':
    return given
  rates = rates_by_size(store_sizes(data), temperature=1 / data.mixture_alpha)
  return {name: given[name] * rate for name, rate in rates.items()}


def store_sizes(data: ml_collections.ConfigDict) -> dict[str, int]:
  """Each component's train tokens as its token store's manifests count them; one line for a
  component that reads no store, or stores of different vocabularies, whose tokens are not
  comparable."""
  from t5lite.data import store  # pylint: disable=import-outside-toplevel  # TensorFlow's
  stores = {}
  for name in sorted(data.mixture):
    source = component_data(data, name).source
    if not store.is_store(source):
      raise ValueError(f"data.mixture.{name}.source={source!r} is no token store: "
                       "data.mixture_rule='size' reads each component's size from its store's "
                       'manifests (make one with `t5lite prepare`)')
    stores[name] = store.open_store(os.fspath(paths.path(source)))
  (first, one), *others = stores.items()
  for name, other in others:
    if other.vocabulary['sha256'] != one.vocabulary['sha256']:
      raise ValueError(
          f"data.mixture_rule='size' weighs stores by their tokens, and data.mixture.{first}'s "
          f'holds ids of the vocabulary {one.vocabulary["name"]!r} (sha256 '
          f'{one.vocabulary["sha256"][:12]}), data.mixture.{name}\'s of '
          f'{other.vocabulary["name"]!r} (sha256 {other.vocabulary["sha256"][:12]}): prepare '
          'them with one --vocabulary')
  return {name: sum(manifest['tokens']['train'] for manifest in found.manifests)
          for name, found in stores.items()}


def describe(data: ml_collections.ConfigDict) -> str:
  """The mixture's rates in a line per component: its share of the rows, its rows in a cycle,
  and the size its rate is made of under the 'size' rule."""
  rows = rows_per_cycle(component_weights(data))
  cycle = sum(rows.values())
  sizes = store_sizes(data) if data.mixture_rule == 'size' else {}
  rule = (f'size ** {data.mixture_alpha}' if data.mixture_rule == 'size' else 'weights')
  return '\n'.join([f'mixture by {rule}: rows per cycle of {cycle:,}'] + [
      f'  {name}: {rows[name] / cycle:.2%} ({rows[name]:,} rows'
      + (f'; {sizes[name]:,} train tokens)' if sizes else ')') for name in sorted(rows)])


def rates_by_size(sizes: dict[str, float], cap: float | None = None,
                  temperature: float = 1.0) -> dict[str, float]:
  """Weights proportional to each component's size (examples or tokens), as seqio's
  `mixing_rate_num_examples`: each size capped at `cap`, then raised to 1 / `temperature`
  (above 1 flattens toward equal weights): {'a': 100, 'b': 400}, cap=300 -> {'a': 100, 'b': 300};
  temperature=2 -> {'a': 10, 'b': 20}."""
  if temperature <= 0:
    raise ValueError(f'temperature={temperature} must be positive')
  capped = {name: min(size, cap) if cap else size for name, size in sizes.items()}
  return {name: math.pow(size, 1 / temperature) for name, size in capped.items()}
