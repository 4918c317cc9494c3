"""`t5lite COMMAND --help` documents every flag, its default, the overrides and T5LITE_DEBUG."""

import argparse

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
    if action.default not in (None, False) and not action.required:
      assert f'(default: {action.default})' in text, (command, action.option_strings)


def test_defaults_are_shown_where_they_say_something():
  text = ' '.join(subparsers()['infer'].format_help().split())
  assert 'beam length penalty ((5 + length) / 6)**alpha (default: 0.6)' in text
  assert '(default: None)' not in text and '(default: False)' not in text
  assert '--workdir WORKDIR a run\'s workdir' in text


def test_a_missing_flag_is_one_line_and_status_2(capsys):
  with pytest.raises(SystemExit) as stop:
    cli.main(['export', '--workdir=somewhere'])
  assert stop.value.code == 2
  assert capsys.readouterr().err.splitlines() == [
      't5lite export: error: the following arguments are required: --out '
      '(see t5lite export --help)']
