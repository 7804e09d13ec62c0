package cluster

// logFormat2 is the first log format with witnessed epochs
// (cmdRevokeUnwitnessed).
const logFormat2 = 2
