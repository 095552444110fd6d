"""RocketMQ's protocol, shared by the operator and the development harness: the remoting codec
(``remoting``: bytes in, values out), the routes a NameServer answers with and their decoders
(``route``, likewise pure) and an asyncio NameServer client (``nameserver``)."""
