import argparse
from typing import Any

def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    return subparsers.add_parser("cut")

def run(args: argparse.Namespace) -> int:
    return 2
