"""The operator: watches Topics, ConsumerGroups, Pods and Nodes and publishes each group's assignment."""
