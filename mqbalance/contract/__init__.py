"""The contract between the parts: resource names and labels, the assignment document the
operator publishes and the sidecars serve, and the one reader of each wire format (Topic
specs, strategies, handover). Pure: no Kubernetes, HTTP or Spark; the operator and the sidecar meet
only here.
"""

from mqbalance.contract.document import (
    CONFIGMAP_KEY,
    AssignmentDocument,
    DocumentError,
    LeaseTerms,
    Release,
    configmap_name,
    decode_queue_map,
    encode_queue_map,
    load_json,
    reading,
)
from mqbalance.contract.errors import SpecError
from mqbalance.contract.handover import HandoverMode, HandoverSpec, read_handover
from mqbalance.contract.names import (
    API_PATH,
    API_VERSION,
    CONSUMER_GROUP_KIND,
    CONSUMER_GROUPS,
    GENERATION_ANNOTATION,
    GROUP,
    GROUP_LABEL,
    MANAGED_BY,
    MAX_GROUP_NAME,
    MEMBER_LEASE_LABEL,
    TOPIC_KIND,
    TOPICS,
    VERSION,
    custom_path,
    member_lease_name,
)
from mqbalance.contract.releases import Ack, decode_acks, releases_configmap_name
from mqbalance.contract.strategy import read_strategy, write_strategy
from mqbalance.contract.topic import (
    NameServerSpec,
    RouteNotRead,
    TopicSpec,
    read_name_server,
    read_topic,
    read_topic_spec,
    reads_name_server,
    topic_name,
)

__all__ = [
    "API_PATH",
    "API_VERSION",
    "CONFIGMAP_KEY",
    "CONSUMER_GROUPS",
    "CONSUMER_GROUP_KIND",
    "GENERATION_ANNOTATION",
    "GROUP",
    "GROUP_LABEL",
    "MANAGED_BY",
    "MAX_GROUP_NAME",
    "MEMBER_LEASE_LABEL",
    "TOPICS",
    "TOPIC_KIND",
    "VERSION",
    "Ack",
    "AssignmentDocument",
    "DocumentError",
    "HandoverMode",
    "HandoverSpec",
    "LeaseTerms",
    "NameServerSpec",
    "Release",
    "RouteNotRead",
    "SpecError",
    "TopicSpec",
    "configmap_name",
    "custom_path",
    "decode_acks",
    "decode_queue_map",
    "encode_queue_map",
    "load_json",
    "member_lease_name",
    "read_handover",
    "read_name_server",
    "read_strategy",
    "read_topic",
    "read_topic_spec",
    "reading",
    "reads_name_server",
    "releases_configmap_name",
    "topic_name",
    "write_strategy",
]
