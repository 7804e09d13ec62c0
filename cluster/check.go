package cluster

// CheckConfig answers whether Start would accept cfg's settings, without
// starting anything: the node's place in --peers and its Raft exposure
// (plain TCP on an address other machines reach needs --insecure-raft).
// It neither opens the data dir nor binds a port, so `lockd serve
// --check-config` can run it where the node is about to start.
func CheckConfig(cfg Config) error {
	if err := cfg.applyDefaults(); err != nil {
		return err
	}
	return checkRaftExposure(cfg)
}
