"""`t5lite COMMAND --help` documents every flag, its default, the overrides and T5LITE_DEBUG."""

import argparse
import pathlib

import pytest

from t5lite import cli


def subparsers() -> dict[str, argparse.ArgumentParser]:
  actions = [a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction)]
  return dict(actions[0].choices)


@pytest.mark.parametrize('command', sorted(cli.COMMANDS))
def test_every_flag_has_a_help_line_and_the_epilog_names_overrides_and_debug(command):
  sub = subparsers()[command]
  flags = [a for a in sub._actions if a.option_strings and a.dest != 'help']
  assert flags
  for action in flags:
    assert action.help and len(action.help) > 5, (command, action.option_strings)
  text = ' '.join(sub.format_help().split())
  assert '--config.a.b=value' in text and 'T5LITE_DEBUG=1' in text
  for action in flags:
    if not (action.required or any(action.default is unset for unset in cli.UNSET)):
      assert f'(default: {action.default})' in text, (command, action.option_strings)


def test_every_help_ends_with_the_docs_page_that_covers_it():
  """The last line of `t5lite --help` and of each `t5lite COMMAND --help` names a page of docs/
  that exists; every command has its own page (cli.DOCS_PAGES), not the map's fallback."""
  root = pathlib.Path(__file__).parents[1]
  helps = {'t5lite': cli.parser().format_help(),
           **{name: sub.format_help() for name, sub in subparsers().items()}}
  assert set(cli.DOCS_PAGES) == set(subparsers()), 'one docs page per command, no stale ones'
  for name, text in helps.items():
    last = text.rstrip().splitlines()[-1]
    assert last.startswith('docs: docs/'), (name, last)
    assert (root / last.removeprefix('docs: ')).is_file(), (name, last)
    expected = cli.DOCS_PAGES.get(name, 'README.md')
    assert last == f'docs: docs/{expected}', (name, last)


def test_defaults_are_shown_where_they_say_something():
  text = ' '.join(subparsers()['infer'].format_help().split())
  assert 'beam length penalty ((5 + length) / 6)**alpha (default: 0.6)' in text
  assert '(default: None)' not in text and '(default: False)' not in text
  assert '--workdir WORKDIR a run\'s workdir' in text
  assert 'sample from the k most likely; 0: all (default: 0)' in text  # 0 == False, but it says
  text = ' '.join(subparsers()['prepare'].format_help().split())
  assert '0: every core; at most 1,024 (default: 0)' in text
  assert '--shard_index SHARD_INDEX the part this run prepares (default: 0)' in text


def test_prepare_s_default_share_of_malformed_lines_is_the_sources_own():
  """The parser names it without importing sources (which loads TensorFlow)."""
  from t5lite.data import sources  # pylint: disable=import-outside-toplevel
  default = subparsers()['prepare'].get_default('max_bad_fraction')
  assert default == sources.MAX_BAD_FRACTION == 0.01


def test_a_missing_flag_is_one_line_and_status_2(capsys):
  with pytest.raises(SystemExit) as stop:
    cli.main(['export', '--workdir=somewhere'])
  assert stop.value.code == 2
  assert capsys.readouterr().err.splitlines() == [
      't5lite export: error: the following arguments are required: --out '
      '(see t5lite export --help)']
