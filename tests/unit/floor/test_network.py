"""looper.network: the declared reach of looper's servers, checked against
this machine's addresses (given here: no real network is read but /proc
text written by the test)."""

import pytest

from looper import network

# What /proc says on a host with a LAN address and a public one (an alias),
# and IPv6 loopback, link-local, a unique-local and a global address.
FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     +-- 10.1.0.0/16 2 0 2
           |-- 10.1.0.0
              /16 link UNICAST
           |-- 10.1.2.3
              /32 host LOCAL
     |-- 8.8.4.4
        /32 host LOCAL
Local:
     |-- 10.1.2.3
        /32 host LOCAL
"""
IF_INET6 = """00000000000000000000000000000001 01 80 10 80       lo
fe8000000000000000fc00fffe000001 04 40 20 80     eth0
fd000000000000000000000000000002 04 40 00 82     eth0
20014860000000000000000000008888 04 40 00 00     eth0
"""


def test_the_machines_addresses_are_read_from_proc(tmp_path):
  (tmp_path / "trie").write_text(FIB_TRIE)
  (tmp_path / "six").write_text(IF_INET6)
  assert network.addresses(str(tmp_path / "trie"), str(tmp_path / "six")) == [
      "8.8.4.4", "10.1.2.3", "127.0.0.1", "::1", "2001:4860::8888",
      "fd00::2", "fe80::fc:ff:fe00:1"]
  assert network.addresses(str(tmp_path / "none"),
                           str(tmp_path / "six")) is None


# Private: no address IANA lists as globally reachable. Each class by name.
@pytest.mark.parametrize("address, reaches", [
    ("127.0.0.1", "loopback"), ("127.0.1.1", "loopback"), ("::1", "loopback"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"),
    ("192.168.1.20", "private"),  # RFC 1918
    ("100.64.0.1", "private"),  # CGNAT, RFC 6598 (Tailscale's addresses too)
    ("198.18.0.1", "private"), ("198.19.255.1", "private"),  # RFC 2544
    ("169.254.1.1", "private"), ("fe80::1", "private"),  # link-local
    ("fd00::2", "private"),  # unique-local, fc00::/7
    ("192.0.2.2", "private"),  # documentation (this CI machine's LAN)
    ("8.8.4.4", "public"), ("198.20.0.1", "public"), ("100.128.0.1", "public"),
    ("2001:4860::8888", "public"),
])
def test_each_address_lies_within_the_narrowest_reach_that_holds_it(
    address, reaches):
  held = [r for r in network.REACHES if not network.beyond(r, [address])]
  assert held == list(network.REACHES[network.REACHES.index(reaches):])


FIX = {"loopback": "pass --net=private if only the run's machines share that"
                   " network, or run it in a network namespace",
       "private": "pass --net=public behind a firewall that admits only the"
                  " run's machines, or run it on a private network"}


@pytest.mark.parametrize("reach, found, beyond", [
    ("loopback", ["127.0.0.1", "::1"], None),
    ("loopback", ["10.1.2.3", "127.0.0.1", "fe80::1"], "other addresses"
     " (10.1.2.3, fe80::1)"),
    ("private", ["10.1.2.3", "127.0.0.1", "fd00::2", "fe80::1"], None),
    ("private", ["198.18.1.2", "100.64.0.1", "127.0.0.1"], None),
    ("private", ["8.8.4.4", "10.1.2.3", "2001:4860::8888"], "global"
     " addresses (8.8.4.4, 2001:4860::8888)"),
    ("public", ["8.8.4.4"], None),
    ("public", None, None),
])
def test_the_declared_reach_is_checked_against_the_machines_addresses(
    reach, found, beyond):
  assert network.refusal(reach, found, declared=f"N={reach}",
                         flag="--net") == (beyond and (
      f"N={reach}, but this machine has {beyond} and TensorFlow's server"
      f" listens on all of them without authentication; {FIX[reach]}"))


def test_addresses_that_cannot_be_listed_start_only_a_public_server():
  for reach in ("loopback", "private"):
    assert network.refusal(reach, None, declared="N", flag="--net") == (
        "N, but this machine's addresses cannot be listed (no"
        " /proc/net/fib_trie: not Linux), and TensorFlow's server listens on"
        " all of them without authentication; pass --net=public if only the"
        " run's machines can reach it")


@pytest.mark.parametrize("reach, named, beyond", [
    ("private", ("a:2222", ["10.1.2.3"]), None),
    ("private", ("a:2222", []), None),  # not resolved (yet): TF says so
    ("private", ("34.1.2.3:2222", ["34.1.2.3"]), "34.1.2.3: beyond private"),
    ("loopback", ("127.0.0.1:7", ["127.0.0.1"]), None),
    ("loopback", ("vm:7", ["127.0.0.1", "10.1.2.3"]),
     "10.1.2.3: beyond loopback"),
    ("public", ("34.1.2.3:2222", ["34.1.2.3"]), None),
])
def test_the_address_the_run_names_a_server_at_lies_within_the_reach(
    reach, named, beyond):
  # A cloud VM's public address is NAT in front of it: not among its own.
  line = network.refusal(reach, ["127.0.0.1"], declared=f"N={reach}",
                         flag="--net", named=named)
  assert line == (beyond and (
      f"N={reach}, but the run names this server at {named[0]} ({beyond}),"
      f" where its peers reach it without authentication; {FIX[reach]}"))


def test_a_name_resolves_to_its_addresses_and_an_unknown_one_to_none():
  assert network.resolve("127.0.0.1") == ["127.0.0.1"]
  assert network.resolve("[::1]") == ["::1"]
  assert network.resolve("no-such-host.invalid") == []  # RFC 6761: never
