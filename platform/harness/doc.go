// Package harness runs the platform's programs as real processes, for the
// tests and tools that need the whole system: the fault-injection proofs
// (loadtest/prove), the load rig (loadtest/bench/rig), the dashboards test
// and the end-to-end trace test.
//
// It does three things, once, so that those four do not each carry a copy:
//
//   - Build compiles the programs of a source tree into a directory, once per
//     process for each (tree, directory, programs): every test of a package
//     that asks again gets the same binaries.
//   - Start runs one program with its listeners on port 0 and reads the
//     addresses the kernel gave them from the program's own log line
//     ("listening", logged after both listeners are bound). Picking a free
//     port, closing it and handing it to a child is a race with every other
//     process on the machine; reading the bound address is not. Binaries of
//     older revisions, which do not log that line, can still be run with
//     ports picked in advance (Config.PrePickPorts), with that race.
//   - Proc stops (SIGTERM, then SIGKILL after a grace, reporting a hang),
//     kills, restarts on the same addresses, captures the log to a file and
//     tails it for failure messages, and exposes the pid.
//
// Each program has a Spec that states its environment contract once: the
// variables a harness must give it, and the ones it may. The programs'
// own tests check every Spec against the configuration the program really
// reads (CheckSpec), so the contract cannot drift from the code.
//
// Supervision (restarting what dies by itself, counting exits) and
// accounting (CPU time per program) belong to the callers: prove and the
// rig build them on Proc.
package harness
