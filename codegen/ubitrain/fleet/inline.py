"""An in-process Flower Grid: the fleet's ServerApp logic (run_server) with every client
answered here, one after another, by the fleet's ClientApp (its mods included). No Ray, no
processes: what tests and measurements of the server's merge use to run rounds in seconds.
The messages are Flower's own Message objects, the strategies Flower's own."""

from __future__ import annotations

from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid

CLIENT_ERROR = 0  # Flower's ErrorCode.UNKNOWN: the ClientApp raised


class InlineGrid(Grid):
    """Nodes 1..clients, node n being partition n - 1; `app` the ClientApp that answers."""

    def __init__(self, app, clients: int, run_config: dict | None = None):
        from flwr.supercore.task_identity import TaskIdentity

        self.app, self.clients = app, clients
        self.run_config = run_config or {}
        self._run = None
        # what Flower's engines set in the process that runs a ServerApp: Message() reads it
        if TaskIdentity._run_id is None:
            TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1

    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id=dst_node_id, message_type=message_type,
                       group_id=group_id, ttl=ttl)

    def get_node_ids(self):
        return list(range(1, self.clients + 1))

    def push_messages(self, messages):
        raise NotImplementedError("InlineGrid answers in send_and_receive")

    def pull_messages(self, message_ids):
        raise NotImplementedError("InlineGrid answers in send_and_receive")

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            context = Context(run_id=0, node_id=node, state=RecordDict(),
                              node_config={"partition-id": node - 1,
                                           "num-partitions": self.clients},
                              run_config=self.run_config)
            try:
                replies.append(self.app(msg, context))
            except Exception as err:  # noqa: BLE001 - a client's failure is its reply
                replies.append(Message(Error(CLIENT_ERROR, f"{type(err).__name__}: {err}"),
                                       reply_to=msg))
        return replies
