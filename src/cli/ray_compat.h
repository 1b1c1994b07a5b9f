// `ray` for container images (docs/kuberay.md): the Ray CLI commands KubeRay runs in its pods,
// mapped onto Torus's. The single file lib/torus/ray-compat/ray under the install prefix runs
// `torus ray ARGS`; an image puts that directory on PATH, so nothing else shadows a real Ray.
//
//   ray start [--head] [--address H:P] [--port N] [--block] [--num-cpus N] [--num-gpus N]
//             [--memory B] [--resources JSON] [--labels k=v,...|JSON] [--object-store-memory B]
//             [--node-ip-address IP] [--dashboard-host H] [--dashboard-port N]
//             [--dashboard-agent-listen-port N] [--include-dashboard BOOL]   -> torus start ...
//   ray health-check --address H:P      exit 0 when a Torus head answers there (one try)
//   ray stop [--force]                  -> torus stop
//   ray status [--address H:P]          -> torus status
//
// A head started this way serves clients on --port or Ray's 6379. Daemons bind --node-ip-address,
// else this host's outward address (as Ray picks its node IP). The cluster token comes from
// TORUS_TOKEN, else RAY_AUTH_TOKEN (Ray's token auth), else the session (a head mints one).
// Flags Torus has no use for are listed once on stderr as ignored; an unknown command exits 2.
// Pure translation (TranslateRay) plus a main that execs the torus binary; no threads.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace torus {

struct RayTranslation {
  std::vector<std::string> torus_args;        // the torus command line, without the program
  std::vector<std::string> ignored;           // Ray flags without a Torus meaning, once each
  std::map<std::string, std::string> env;     // variables to set for the torus command
  std::string error;                          // set: refuse (exit 2) with this message
  bool health_check = false;                  // `ray health-check`: probe torus_args[0] (H:P)
};

// `args`: what follows `ray`. `env`: the environment (TORUS_TOKEN, RAY_AUTH_TOKEN).
// `default_ip`: the address daemons bind when --node-ip-address is not given.
RayTranslation TranslateRay(const std::vector<std::string>& args,
                            const std::map<std::string, std::string>& env,
                            const std::string& default_ip);

// This host's address towards the outside (the source address of a route to a public address;
// no packet is sent), or 127.0.0.1.
std::string OutwardAddress();

// `torus ray ARGS` (and the `ray` script): translates, then runs the torus command (exec).
int RayCompatMain(const std::vector<std::string>& args);

}  // namespace torus
