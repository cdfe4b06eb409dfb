"""ccoll.units: one parser for byte sizes (command lines lenient, policy YAML strict), one for tc link
rates, their formatters, and the dtype names."""
from __future__ import annotations

import argparse

import pytest
import torch

from ccoll.errors import CcollError, UnitsError
from ccoll.units import (DTYPES, dtype_name, format_nbytes, format_rate_bits, human_nbytes, nbytes_arg,
                         parse_nbytes, parse_nbytes_list, parse_rate_bits)


@pytest.mark.parametrize("text,expected", [
    ("1024", 1024), ("64K", 64 << 10), ("64KiB", 64 << 10), ("64kb", 64 << 10), ("4KB", 4 << 10),
    ("1M", 1 << 20), ("8MiB", 8 << 20), ("1.5M", 3 << 19), ("3G", 3 << 30), (" 12 KB ", 12 << 10), ("7B", 7),
])
def test_given_command_line_sizes_when_parsing_expect_binary_multiples(text, expected):
    assert parse_nbytes(text) == expected


@pytest.mark.parametrize("text", ["x", "", "5iB", "1.3K", "-1", "1T", "64 Ki"])
def test_given_malformed_sizes_when_parsing_expect_units_error_listing_the_forms(text):
    with pytest.raises(UnitsError, match="is not a size; write an integer"):
        parse_nbytes(text)


def test_given_policy_sizes_when_parsing_strictly_expect_only_B_KiB_MiB_GiB():
    assert parse_nbytes("64KiB", strict=True) == 64 << 10
    assert parse_nbytes("1 MiB", strict=True) == 1 << 20
    assert parse_nbytes(4096, strict=True) == 4096
    for text in ("12 KB", "1M", "1.5MiB", True):
        with pytest.raises(UnitsError, match="B/KiB/MiB/GiB"):
            parse_nbytes(text, strict=True)


def test_given_sizes_when_formatting_expect_exact_units_that_parse_back():
    for n in (1, 1000, 1 << 10, 64 << 10, 3 << 20, 5 << 30, (1 << 20) + 1):
        assert parse_nbytes(format_nbytes(n), strict=True) == n
        assert parse_nbytes(format_nbytes(n, short=True)) == n
    assert (format_nbytes(65536), format_nbytes(65536, short=True), format_nbytes(1000)) == ("64KiB", "64K", "1000")
    assert (human_nbytes(1536), human_nbytes(1536, digits=1), human_nbytes(12)) == ("1.50 KiB", "1.5 KiB", "12 B")
    assert parse_nbytes_list("64K, 1M,,8M") == [64 << 10, 1 << 20, 8 << 20]


def test_given_tc_rates_when_parsing_expect_bits_per_second_and_typed_errors():
    assert parse_rate_bits("1gbit") == 1e9 and parse_rate_bits("100mbit") == 1e8
    assert parse_rate_bits("125mbps") == 1e9  # tc: bps is bytes per second
    assert (format_rate_bits(1e9), format_rate_bits(1e8), format_rate_bits(1.5e9)) == ("1gbit", "100mbit", "1500mbit")
    for bad in ("1 gbit", "0mbit", "fast", "1gb"):
        with pytest.raises(UnitsError, match="not a link rate"):
            parse_rate_bits(bad)
    assert issubclass(UnitsError, CcollError) and issubclass(UnitsError, ValueError)


def test_given_argparse_when_a_size_is_bad_expect_the_parsers_message():
    p = argparse.ArgumentParser()
    p.add_argument("-b", type=nbytes_arg)
    assert p.parse_args(["-b", "2M"]).b == 2 << 20
    with pytest.raises(argparse.ArgumentTypeError, match="is not a size"):
        nbytes_arg("2Q")


def test_given_dtype_aliases_when_naming_expect_canonical_torch_dtypes():
    assert DTYPES[dtype_name("bf16")] is torch.bfloat16 and DTYPES[dtype_name("half")] is torch.float16
    assert dtype_name("float32") == "float32" and dtype_name("int7") == "int7"
