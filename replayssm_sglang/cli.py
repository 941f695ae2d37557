"""`replayssm-sglang`: patch SGLang, inspect it, and plan memory/traffic.

    replayssm-sglang apply   [--target DIR] [--dry-run]
    replayssm-sglang revert  [--target DIR]
    replayssm-sglang status  [--target DIR]
    replayssm-sglang check   [--target DIR]
    replayssm-sglang refresh NAME --target EDITED --pristine DIR [--add-file REL ...] | --pin-only
    replayssm-sglang plan    --config config.json [...]
    replayssm-sglang doctor

Exit status: 0 on success, 1 when a tree is not in a usable state (status/check), 2 on a refusal.
"""

from __future__ import annotations

import argparse
import sys


_ENGINE_COMMANDS = ("apply", "revert", "status", "check", "refresh")


def _add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        metavar="DIR",
        help="folder that contains the `sglang` package (site-packages, or python/ of a source "
        "checkout); default: the SGLang that `import sglang` finds",
    )


def _print_status(st) -> None:
    print(f"SGLang {st.version or '?'} at {st.target}/sglang: {st.state}")
    for p in st.patches:
        print(f"  [{'x' if p.applied else ' '}] {p.name}")
    for line in st.problems:
        print(f"  ! {line}")


def _cmd_apply(args) -> int:
    from replayssm_sglang import patching

    r = patching.apply(args.target, dry_run=args.dry_run)
    print(r.message)
    return 0


def _cmd_revert(args) -> int:
    from replayssm_sglang import patching

    print(patching.revert(args.target).message)
    return 0


def _cmd_status(args) -> int:
    from replayssm_sglang import patching

    st = patching.status(args.target)
    _print_status(st)
    return 0 if st.ok else 1


def _cmd_check(args) -> int:
    from replayssm_sglang import patching

    r = patching.check(args.target)
    _print_status(r.status)
    print(r.message)
    return 0


def _cmd_refresh(args) -> int:
    from replayssm_sglang import patching

    print(patching.refresh(args.name, args.target, args.pristine, args.add_file or [], args.pin_only))
    return 0


TOOL_COMMANDS = ("plan", "doctor")  # subcommands that live in their own modules


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full parser; ``command`` (when known) spares importing the tool modules not needed."""
    load_tools = command is None or command not in _ENGINE_COMMANDS
    ap = argparse.ArgumentParser(prog="replayssm-sglang", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("apply", help="apply the patch series (all or nothing; a no-op when applied)")
    _add_target(p)
    p.add_argument("--dry-run", action="store_true", help="check that it would apply; write nothing")
    p.set_defaults(func=_cmd_apply)

    p = sub.add_parser("revert", help="restore the pristine SGLang files byte for byte")
    _add_target(p)
    p.set_defaults(func=_cmd_revert)

    p = sub.add_parser("status", help="per patch: applied or not; tree pristine, patched or drifted")
    _add_target(p)
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("check", help="verify version and hashes and that the series applies (writes nothing)")
    _add_target(p)
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("refresh", help="developers: regenerate a patch from an edited tree, then re-pin")
    p.add_argument("name", nargs="?", help="patch file name (appended to the series if new)")
    p.add_argument("--target", metavar="DIR", help="the edited tree (series applied, plus your edits)")
    p.add_argument("--pristine", metavar="DIR", help="an untouched SGLang tree of the pinned version "
                   "(default: the installed one, if pristine)")
    p.add_argument("--add-file", action="append", metavar="REL",
                   help="a file (relative to the target, e.g. sglang/srt/foo.py) the patch starts touching")
    p.add_argument("--pin-only", action="store_true", help="only recompute patches/PIN.json")
    p.set_defaults(func=_cmd_refresh)

    import importlib

    for mod in TOOL_COMMANDS:
        if load_tools or mod == command:
            importlib.import_module(f"replayssm_sglang.{mod}").add_parser(sub)
        else:  # not asked for: skip importing it (plan pulls in torch, seconds on a cold start)
            sub.add_parser(mod, add_help=False).add_argument("rest", nargs=argparse.REMAINDER)
    return ap


def main(argv: list[str] | None = None) -> int:
    from replayssm_sglang.patching import PatchError

    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    try:
        return args.func(args)
    except PatchError as e:
        print(f"replayssm-sglang {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
