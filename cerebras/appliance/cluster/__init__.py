"""Clients of a Cerebras cluster's management services. There is no cluster here; see
`cerebras.appliance.cluster.client`."""
