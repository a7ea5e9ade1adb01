"""errors.py ClusterReconfiguring: "the slot is being migrated (TRYAGAIN ...), the cluster is down
for it (CLUSTERDOWN), or redirections kept pointing elsewhere" - a typed transient error whose
command did not run (ran False).

Added after a mutation review: no test failed with this guarantee broken.
"""

from __future__ import annotations

import pytest

from respire_actors.errors import ClusterReconfiguring
from respire_actors.redis import client as client_module
from respire_actors.redis._protocol import ReplyError

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "reply",
    [
        "CLUSTERDOWN The cluster is down",
        "CLUSTERDOWN Hash slot not served",
        "TRYAGAIN Multiple keys request during rehashing of slot",
    ],
)
async def test_cluster_transient_replies_are_typed(reply: str) -> None:
    error = client_module._map_reply(reply)
    assert isinstance(error, ClusterReconfiguring)
    assert error.ran is False
    # and the shared-connection path waits such a reply out instead of returning it at once
    assert client_module._cluster_transient(ReplyError(reply))


@pytest.mark.parametrize(
    "reply",
    [
        "ERR Script attempted to access a non local key in a cluster node script: "
        "f_0123456789abcdef, on @user_script:12.",
        "ERR Attempted to access a non local key in a cluster node script: f_0, on @user_script:3.",
    ],
)
async def test_script_stopped_at_a_migrating_key_may_have_written(reply: str) -> None:
    """client.py: "the script is not rolled back: what it wrote before that key stays" - so
    the error must not claim the call did not run (ran None, not False)."""
    error = client_module._map_reply(reply)
    assert isinstance(error, ClusterReconfiguring)
    assert error.ran is None
