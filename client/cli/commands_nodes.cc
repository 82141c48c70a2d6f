// `tributary nodes`.
#include <iostream>
#include <vector>

#include "absl/strings/ascii.h"
#include "client/cli/commands.h"
#include "client/cli/table.h"
#include "common/status_macros.h"

namespace tributary::client::cli {
namespace {

std::string StateName(v1::NodeState state) {
  switch (state) {
    case v1::NODE_STATE_ALIVE:
      return "alive";
    case v1::NODE_STATE_DEAD:
      return "dead";
    default:
      return "unknown";
  }
}

std::vector<std::string> ToVector(const google::protobuf::RepeatedPtrField<std::string>& items) {
  return std::vector<std::string>(items.begin(), items.end());
}

absl::Status RunNodes(GlobalOptions& global, bool json) {
  ControllerClient controller(global);
  ASSIGN_OR_RETURN(v1::ListNodesResponse response, controller.ListNodes());
  if (json) {
    ASSIGN_OR_RETURN(std::string text, MessageToJson(response));
    std::cout << text << std::endl;
    return absl::OkStatus();
  }
  Table table({"NODE", "STATE", "DATA PLANE", "CORES", "NIC Gbit/s", "SUM GB/s", "CPU BUSY",
               "HEARTBEAT", "WORKER OF", "SERVER OF"});
  for (size_t c : {3, 4, 5, 6, 7}) table.SetAlign(c, Table::Align::kRight);
  for (const v1::Node& node : response.nodes()) {
    const v1::NodeInventory& inv = node.inventory();
    table.AddRow({node.node_id(), StateName(node.state()), inv.data_plane_address(),
                  std::to_string(inv.cpu_cores()), FormatFixed(inv.nic_bytes_per_s() * 8 / 1e9, 1),
                  inv.sum_bytes_per_s() > 0 ? FormatFixed(inv.sum_bytes_per_s() / 1e9, 2) : "-",
                  FormatFixed(node.load().cpu_busy_fraction() * 100, 0) + "%",
                  FormatFixed(node.last_heartbeat_age_s(), 1) + " s",
                  JoinOrDash(ToVector(node.worker_of())), JoinOrDash(ToVector(node.server_of()))});
  }
  std::cout << table.Render();
  if (table.num_rows() == 0) std::cout << "(no nodes registered)" << std::endl;
  return absl::OkStatus();
}

}  // namespace

void AddNodesCommand(CLI::App& app, GlobalOptions& global) {
  CLI::App* command = app.add_subcommand("nodes", "list the nodes the controller knows");
  auto json = std::make_shared<bool>(false);
  command->add_flag("--json", *json, "print the ListNodes response as JSON");
  SetAction(command, global, [&global, json] { return RunNodes(global, *json); });
}

}  // namespace tributary::client::cli
