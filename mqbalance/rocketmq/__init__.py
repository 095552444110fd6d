"""RocketMQ's protocol, shared by the operator and the development harness: the remoting codec
(``remoting``: bytes in, values out) and an asyncio NameServer client (``nameserver``)."""
