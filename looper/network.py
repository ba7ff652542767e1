"""Who may reach looper's servers: a declared reach, checked against this
machine's addresses before a server starts.

Synopsis::

    from looper import network
    line = network.refusal("private", network.addresses(),
                           declared="--network=private", flag="--network")
    if line: sys.exit(line)   # one line: the addresses beyond it, the fix

Every server looper starts is TensorFlow's gRPC: the tf.data service's
dispatcher and workers (looper data_service --network) and each training
worker's, for its collectives (config.distribution.network). It listens on
every interface (0.0.0.0 and ::; no setting narrows it) without
authentication, and runs the TensorFlow ops a caller sends it (TensorFlow's
SECURITY.md: whoever reaches it runs "arbitrary code with the privileges of
the process"). So its reach is declared, one of REACHES, and holds only if
every address of this machine lies within it:
  loopback  none but loopback (127/8, ::1): a network namespace, a container
            without a network;
  private   none globally reachable by IANA's special-purpose registries
            (ipaddress.is_global): RFC 1918, CGNAT 100.64/10, the benchmark
            range 198.18/15, fc00::/7, link-local, documentation ranges;
  public    any: only a firewall admitting the run's machines alone bounds
            who connects.
An address the run names a server at must lie within it too (`named`): a
cloud VM's public address is NAT in front of it, never on its interfaces.

No TensorFlow here (the floor): the machine's addresses come from Linux's
/proc; elsewhere they cannot be listed, and only `public` starts.
"""

import ipaddress
import socket

REACHES = ("loopback", "private", "public")


def addresses(fib_trie: str = "/proc/net/fib_trie",
              if_inet6: str = "/proc/net/if_inet6") -> list[str] | None:
  """This machine's own IPv4 and IPv6 addresses (Linux), sorted; None
  where the kernel does not list them."""
  try:
    with open(fib_trie) as f:
      trie = f.read().splitlines()
    with open(if_inet6) as f:
      six = f.read().splitlines()
  except OSError:
    return None
  found = set()
  for above, line in zip(trie, trie[1:]):
    # "|-- 192.0.2.2" then "/32 host LOCAL": an address of this host.
    if line.split() == ["/32", "host", "LOCAL"] and "|--" in above:
      found.add(ipaddress.ip_address(above.split()[-1]))
  for line in six:  # "fd000000000000000000000000000002 04 40 00 82 eth0"
    if line.strip():
      found.add(ipaddress.IPv6Address(int(line.split()[0], 16)))
  return [str(a) for a in sorted(found, key=lambda a: (a.version, a))]


def resolve(host: str) -> list[str]:
  """The addresses `host` (a name, an address, `[v6]`) resolves to here;
  [] if it does not (yet: a peer's DNS record may come later)."""
  try:
    infos = socket.getaddrinfo(host.strip("[]"), None)
  except (OSError, UnicodeError):
    return []
  return sorted({info[4][0].split("%")[0] for info in infos})


def beyond(reach: str, found: list[str]) -> list[str]:
  """Those of the addresses `found` that `reach` does not hold."""
  if reach == "loopback":
    return [a for a in found if not ipaddress.ip_address(a).is_loopback]
  if reach == "private":
    return [a for a in found if ipaddress.ip_address(a).is_global]
  return []


def refusal(reach: str, found: list[str] | None, *, declared: str,
            flag: str, named: tuple[str, list[str]] | None = None
            ) -> str | None:
  """Why the reach does not fit, in one line with the fix; None if it does.

  `found`: this machine's addresses (None: not listed); `declared`: how
  the line names the declaration ("--network=private"); `flag`: the flag
  the fix sets; `named`: (where the run names this server, "host:port",
  its addresses) when peers reach it by a name.
  """
  if reach == "public":
    return None
  if found is None:
    return (f"{declared}, but this machine's addresses cannot be listed (no"
            " /proc/net/fib_trie: not Linux), and TensorFlow's server listens"
            " on all of them without authentication; pass"
            f" {flag}=public if only the run's machines can reach it")
  if reach == "loopback":
    kind, fix = "other", (f"pass {flag}=private if only the run's machines"
                          " share that network, or run it in a network"
                          " namespace")
  else:
    kind, fix = "global", (f"pass {flag}=public behind a firewall that"
                           " admits only the run's machines, or run it on a"
                           " private network")
  if outside := beyond(reach, found):
    return (f"{declared}, but this machine has {kind} addresses"
            f" ({', '.join(outside)}) and TensorFlow's server listens on all"
            f" of them without authentication; {fix}")
  if named and (outside := beyond(reach, named[1])):
    return (f"{declared}, but the run names this server at {named[0]}"
            f" ({', '.join(outside)}: beyond {reach}), where its peers"
            f" reach it without authentication; {fix}")
  return None
