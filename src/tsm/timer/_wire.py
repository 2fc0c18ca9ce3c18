"""The wire format of the socket timer (:mod:`tsm.timer.socket_timer`), shared by its client and server.

The server learns each client's pid from the kernel (SO_PEERCRED), so a request can only arm a timer for the
process that sent it. The protocol is binary and small:

* client -> server, one record per call: ``<BBHIid`` = kind (1 acquire, 2 release, 3 ping), flags (1 = reply
  with an ack), scope length, sequence number, pid (0 = "the sender", anything else must equal the kernel's
  pid for the connection), expiration (``time.time()`` seconds; negative = release); then the UTF-8 scope.
* server -> client: ``<BBHI`` = kind (1 welcome, 2 ack, 3 refused, 4 connection rejected), 0, text length,
  value (welcome: the client's pid as the server sees it; ack/refused: the sequence number); then the text.

Delivery: on connect the server checks the peer (pid > 1, not the server, not its ancestor, same user, at
most :data:`MAX_CONNS_PER_PID` connections) and answers *welcome* or *rejected*; the client waits for that
answer, so a refused process gets a TimerError at its first ``acquire``.  After that, ``acquire``/``release`` are fire-and-forget writes on a blocking socket
(back-pressure, never a drop) that cannot be refused, because they name no pid.  Requests that do name a pid
(:meth:`~tsm.timer.SocketTimerClient.send_request`) and every request of a client made with ``ack=True`` wait for the
server's answer; a refusal raises TimerError.  :meth:`~tsm.timer.SocketTimerClient.sync` waits until the server has
processed everything sent before it.

Throughput: every call is still one write, so that a worker that hangs right after ``acquire`` has
its timer armed, and a release is on the socket (where the server's drain before a reap finds it) as soon as
``release`` returns; batching writes in the client would trade that away.  What is cheap instead: the client
keeps a ready-made record per recent scope (one struct call per acquire, none per release), and the server
parses all whole records of a read in one pass with local names, decodes a scope once for a run of records
naming it, and skips arming a timer whose exact release record follows it in the same read (the table ends
the same, and nothing fires in the middle of a read).

Hostile or broken clients: an acquire whose deadline is NaN, infinite or after year 9999 is answered
*refused* (the client's next ``sync``/ack raises TimerError; :class:`~tsm.timer.SocketTimerClient` refuses such values
itself with :class:`~tsm.timer.InvalidTimerRequestError` before sending); a record of an unknown kind or with
a scope longer than :data:`MAX_SCOPE` closes that client's connection.  Refusals are counted in ``stats`` and
logged at a limited rate, and no request, however malformed, stops the server from serving the others or
from reaping on time.  When the process runs out of file descriptors, the server stops accepting for a
moment instead of spinning.
"""

from __future__ import annotations

import functools
import socket
import struct

#: Records: ``<BBHIid`` request (kind, flags, scope length, sequence, pid, expiration) and ``<BBHI`` reply.
_REQ = struct.Struct("<BBHIid")
_REP = struct.Struct("<BBHI")
_PEERCRED = struct.Struct("3i")
ACQUIRE, RELEASE, PING = 1, 2, 3
_KINDS = frozenset((ACQUIRE, RELEASE, PING))
FLAG_ACK = 1
WELCOME, ACK, REFUSED, REJECTED = 1, 2, 3, 4
MAX_SCOPE = 4096  # bytes of UTF-8; keeps every record small
#: Connections one process may hold open at once; more are rejected (each costs the server a descriptor).
MAX_CONNS_PER_PID = 64
_ACCEPT_PAUSE = 0.1  # seconds without accepting after the process ran out of descriptors
_READ = 1 << 16
_DRAIN_MAX = 1 << 22
_OUT_MAX = 1 << 20
_NOSIGNAL = socket.MSG_NOSIGNAL
_HEAD = 12  # bytes of a request record before its expiration
_FRAMES_MAX = 256  # scopes a client keeps ready-made records for
_Frame = tuple[struct.Struct, bytes, bytes, bytes]


@functools.lru_cache(maxsize=64)
def _acquire_packer(size: int) -> tuple[struct.Struct, bytes]:
    """A struct packing a whole fire-and-forget acquire of a ``size``-byte scope, and its fixed first bytes."""
    return struct.Struct(f"<{_HEAD}sd{size}s"), _REQ.pack(ACQUIRE, 0, size, 0, 0, 0.0)[:_HEAD]
