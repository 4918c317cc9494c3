"""The docs cannot rot: every relative link and #anchor in README.md and docs/ resolves, and every
`t5lite ...` and `make ...` command in their code blocks parses as the program would take it (an
existing subcommand and flags, config files that exist, `--config.a.b` keys the config has),
without running any of them."""

import pathlib
import re
import shlex

import pytest

from t5lite import cli
from t5lite import config as config_lib

ROOT = pathlib.Path(__file__).parents[1]
DOCS = [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('**/*.md'))]
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
PLACEHOLDER = re.compile(r'[A-Z][A-Z_]*')  # --step=N, --hf=FOLDER: a value the reader picks


def anchors(markdown: str) -> set[str]:
  """GitHub's heading anchors: lowercased, punctuation dropped, spaces to hyphens, repeats -1..."""
  seen, found = {}, set()
  for heading in re.findall(r'^#+ (.*)$', strip_code(markdown), re.MULTILINE):
    slug = re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')
    found.add(slug if slug not in seen else f'{slug}-{seen[slug]}')
    seen[slug] = seen.get(slug, 0) + 1
  return found


def strip_code(markdown: str) -> str:
  return re.sub(r'^```.*?^```', '', markdown, flags=re.MULTILINE | re.DOTALL)


def code_lines(markdown: str):
  """Each command line of the code blocks, continuation lines joined."""
  for block in re.findall(r'^```[^\n]*\n(.*?)^```', markdown, re.MULTILINE | re.DOTALL):
    yield from block.replace('\\\n', ' ').splitlines()


def commands(program: str):
  """(doc, words) of every command line that runs `program` (also as .venv/bin/PROGRAM)."""
  for doc in DOCS:
    for line in code_lines(doc.read_text(encoding='utf-8')):
      if line.split(maxsplit=1)[:1] not in ([program], [f'.venv/bin/{program}']):
        continue  # other programs, Python, output
      words = shlex.split(line, comments=True)
      if words:
        # optional parts are bracketed and open ends elided: [--step=N] [--config.a=b ...]
        words = [w.strip('[]') for w in words[1:] if w.strip('[]') not in ('', '...')]
        yield doc.name, [placeholder_free(w) for w in words]


def placeholder_free(word: str) -> str:
  flag, sep, value = word.partition('=')
  return f'{flag}=1' if sep and PLACEHOLDER.fullmatch(value) else word


def test_the_docs_exist_and_hold_commands():
  assert DOCS[0].exists()
  assert len(list(commands('t5lite'))) >= 20 and len(list(commands('make'))) >= 2


@pytest.mark.parametrize('doc', DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(doc):
  text = doc.read_text(encoding='utf-8')
  broken = []
  for target in LINK.findall(strip_code(text)):
    if re.match(r'[a-z]+:', target):  # https:, mailto:
      continue
    path, _, anchor = target.partition('#')
    linked = (doc.parent / path) if path else doc
    if not linked.exists():
      broken.append(target)
    elif anchor and linked.suffix == '.md' and anchor not in anchors(
        linked.read_text(encoding='utf-8')):
      broken.append(target)
  assert not broken, f'{doc.name}: {broken}'


def test_every_t5lite_command_parses_with_its_config(monkeypatch):
  monkeypatch.chdir(ROOT)  # a --config path is the checkout's, a bare name a shipped preset
  parser = cli.parser()
  for doc, words in commands('t5lite'):
    args, unknown = parser.parse_known_args(words)
    overrides = [w for w in unknown if w.startswith('--config.')]
    assert len(overrides) == len(unknown), f'{doc}: {words}: unknown {unknown}'
    spec = getattr(args, 'config', None)
    if spec:
      config = config_lib.load(spec)
      config_lib.override(config, overrides)  # an unknown key or a value of another type raises


def test_every_make_command_names_a_target():
  makefile = (ROOT / 'Makefile').read_text(encoding='utf-8')
  targets = set(re.findall(r'^([\w-]+):', makefile, re.MULTILINE))
  for doc, words in commands('make'):
    named = [w for w in words if '=' not in w and not w.startswith('-')]
    assert named and set(named) <= targets, f'{doc}: make {" ".join(words)}'


def test_the_readme_is_a_landing_page():
  """What, for whom, set-up, a tour, what is measured and the map: the rest lives in docs/."""
  lines = DOCS[0].read_text(encoding='utf-8').splitlines()
  assert len(lines) <= 200, f'README.md has {len(lines)} lines: move the detail to a docs/ page'
  linked = {target.partition('#')[0] for target in LINK.findall('\n'.join(lines))}
  pages = {str(page.relative_to(ROOT)) for page in (ROOT / 'docs').glob('*.md')}
  assert pages - {'docs/README.md'} <= linked, 'every docs/ page is on the README map'
