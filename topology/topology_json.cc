// Our JSON / YAML topology form: a generic mapping of tributary.v1.Topology through protobuf
// reflection, so the file format follows the message field for field (snake_case names, nested
// objects, arrays for repeated fields). YAML is read into the same JSON tree, remembering each
// node's line for error messages.
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "topology/topology_parsers.h"
#include "topology/topology_util.h"

namespace tributary::topology {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using json = nlohmann::ordered_json;

// A value for an error message. Strings that are not UTF-8 are replaced, not thrown on (a YAML
// value of raw bytes aborted the parser here: finding of tests/fuzz/topology_yaml_fuzz.cc).
std::string Dump(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }
using tributary::v1::Topology;

// Fields whose "unknown" value is -1 rather than proto3's 0: always written, -1 when absent.
bool MinusOneDefault(const FieldDescriptor* f) {
  return f->cpp_type() == FieldDescriptor::CPPTYPE_INT32 && !f->is_repeated() &&
         (f->name() == "numa_node" || f->name() == "socket_id");
}

class Decoder {
 public:
  Decoder(std::string_view source, const std::map<std::string, int>* lines)
      : source_(source), lines_(lines) {}

  absl::Status Message(const json& j, google::protobuf::Message* m, const std::string& path) {
    if (!j.is_object()) return Error(path, "expected an object");
    const auto* desc = m->GetDescriptor();
    const auto* refl = m->GetReflection();
    for (int i = 0; i < desc->field_count(); ++i) {
      if (MinusOneDefault(desc->field(i))) refl->SetInt32(m, desc->field(i), -1);
    }
    for (const auto& [key, value] : j.items()) {
      std::string at = path.empty() ? key : absl::StrCat(path, ".", key);
      const FieldDescriptor* f = desc->FindFieldByName(key);
      if (f == nullptr) return Error(at, "unknown field");
      if (f->is_repeated()) {
        if (value.is_null()) continue;
        if (!value.is_array()) return Error(at, "expected an array");
        for (size_t k = 0; k < value.size(); ++k) {
          RETURN_IF_ERROR(Field(value[k], m, f, absl::StrCat(at, "[", k, "]")));
        }
      } else {
        RETURN_IF_ERROR(Field(value, m, f, at));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Error(const std::string& path, const std::string& what) {
    std::string where = path.empty() ? "top level" : path;
    if (lines_ != nullptr) {
      auto it = lines_->find(path);
      if (it != lines_->end()) where = absl::StrCat("line ", it->second, ": ", where);
    }
    return absl::InvalidArgumentError(absl::StrCat(std::string(source_), ": ", where, ": ", what));
  }

  absl::StatusOr<int64_t> Integer(const json& v, const std::string& at, int64_t lo, int64_t hi) {
    int64_t out = 0;
    if (v.is_number_integer()) {
      out = v.get<int64_t>();
    } else if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
               std::abs(v.get<double>()) < 9e18) {
      out = static_cast<int64_t>(v.get<double>());
    } else {
      return Error(at, absl::StrCat("expected an integer, got ", Dump(v)));
    }
    if (out < lo || out > hi) return Error(at, absl::StrCat(out, " is out of range"));
    return out;
  }

  absl::Status Field(const json& v, google::protobuf::Message* m, const FieldDescriptor* f,
                     const std::string& at) {
    const auto* refl = m->GetReflection();
    const bool rep = f->is_repeated();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        google::protobuf::Message* sub = rep ? refl->AddMessage(m, f) : refl->MutableMessage(m, f);
        return Message(v, sub, at);
      }
      case FieldDescriptor::CPPTYPE_INT32: {
        ASSIGN_OR_RETURN(int64_t x, Integer(v, at, std::numeric_limits<int32_t>::min(),
                                            std::numeric_limits<int32_t>::max()));
        rep ? refl->AddInt32(m, f, static_cast<int32_t>(x))
            : refl->SetInt32(m, f, static_cast<int32_t>(x));
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        ASSIGN_OR_RETURN(int64_t x, Integer(v, at, std::numeric_limits<int64_t>::min(),
                                            std::numeric_limits<int64_t>::max()));
        rep ? refl->AddInt64(m, f, x) : refl->SetInt64(m, f, x);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        if (!v.is_number()) return Error(at, absl::StrCat("expected a number, got ", Dump(v)));
        rep ? refl->AddDouble(m, f, v.get<double>()) : refl->SetDouble(m, f, v.get<double>());
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_STRING: {
        if (!v.is_string()) return Error(at, absl::StrCat("expected a string, got ", Dump(v)));
        rep ? refl->AddString(m, f, v.get<std::string>())
            : refl->SetString(m, f, v.get<std::string>());
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        if (!v.is_boolean()) return Error(at, absl::StrCat("expected true/false, got ", Dump(v)));
        rep ? refl->AddBool(m, f, v.get<bool>()) : refl->SetBool(m, f, v.get<bool>());
        return absl::OkStatus();
      }
      default:
        return Error(at, "unsupported field type");
    }
  }

  std::string_view source_;
  const std::map<std::string, int>* lines_;
};

json Encode(const google::protobuf::Message& m) {
  json out = json::object();
  const auto* desc = m.GetDescriptor();
  const auto* refl = m.GetReflection();
  for (int i = 0; i < desc->field_count(); ++i) {
    const FieldDescriptor* f = desc->field(i);
    auto scalar = [&](int k) -> json {
      const bool rep = k >= 0;
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_MESSAGE:
          return Encode(rep ? refl->GetRepeatedMessage(m, f, k) : refl->GetMessage(m, f));
        case FieldDescriptor::CPPTYPE_INT32:
          return rep ? refl->GetRepeatedInt32(m, f, k) : refl->GetInt32(m, f);
        case FieldDescriptor::CPPTYPE_INT64:
          return rep ? refl->GetRepeatedInt64(m, f, k) : refl->GetInt64(m, f);
        case FieldDescriptor::CPPTYPE_DOUBLE:
          return rep ? refl->GetRepeatedDouble(m, f, k) : refl->GetDouble(m, f);
        case FieldDescriptor::CPPTYPE_STRING:
          return rep ? refl->GetRepeatedString(m, f, k) : refl->GetString(m, f);
        case FieldDescriptor::CPPTYPE_BOOL:
          return rep ? refl->GetRepeatedBool(m, f, k) : refl->GetBool(m, f);
        default:
          return nullptr;
      }
    };
    if (f->is_repeated()) {
      int n = refl->FieldSize(m, f);
      if (n == 0) continue;
      json arr = json::array();
      for (int k = 0; k < n; ++k) arr.push_back(scalar(k));
      out[f->name()] = std::move(arr);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (refl->HasField(m, f)) out[f->name()] = scalar(-1);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT32 || refl->HasField(m, f)) {
      // Integers (ids, indices, counts) are always written: "index: 0" reads better than
      // nothing, and numa_node / socket_id must be, as their absence means -1.
      out[f->name()] = scalar(-1);
    }
  }
  return out;
}

// YAML -> JSON, recording the line of every node under its field path.
absl::StatusOr<json> YamlToJson(const YAML::Node& node, const std::string& path,
                                std::map<std::string, int>& lines, std::string_view source) {
  if (node.Mark().line >= 0) lines[path] = node.Mark().line + 1;
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return json(nullptr);
    case YAML::NodeType::Sequence: {
      json arr = json::array();
      for (size_t k = 0; k < node.size(); ++k) {
        ASSIGN_OR_RETURN(json v,
                         YamlToJson(node[k], absl::StrCat(path, "[", k, "]"), lines, source));
        arr.push_back(std::move(v));
      }
      return arr;
    }
    case YAML::NodeType::Map: {
      json obj = json::object();
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) {
          return absl::InvalidArgumentError(absl::StrCat(
              std::string(source), ": line ", kv.first.Mark().line + 1, ": keys must be scalars"));
        }
        std::string key = kv.first.Scalar();
        std::string at = path.empty() ? key : absl::StrCat(path, ".", key);
        ASSIGN_OR_RETURN(obj[key], YamlToJson(kv.second, at, lines, source));
      }
      return obj;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = node.Scalar();
      if (node.Tag() == "!") return json(s);  // quoted: always a string
      int64_t i = 0;
      double d = 0;
      if (s == "true" || s == "false") return json(s == "true");
      if (s == "~" || s == "null") return json(nullptr);
      if (absl::SimpleAtoi(s, &i)) return json(i);
      if (absl::SimpleAtod(s, &d) && std::isfinite(d)) return json(d);
      return json(s);
    }
  }
  return json(nullptr);
}

void EmitYaml(const json& j, YAML::Emitter& out) {
  if (j.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [key, value] : j.items()) {
      out << YAML::Key << key << YAML::Value;
      EmitYaml(value, out);
    }
    out << YAML::EndMap;
  } else if (j.is_array()) {
    bool flat = std::none_of(j.begin(), j.end(),
                             [](const json& v) { return v.is_object() || v.is_array(); });
    out << (flat ? YAML::Flow : YAML::Block) << YAML::BeginSeq;
    for (const auto& v : j) EmitYaml(v, out);
    out << YAML::EndSeq;
  } else if (j.is_string()) {
    out << YAML::DoubleQuoted << j.get<std::string>();
  } else if (j.is_boolean()) {
    out << j.get<bool>();
  } else if (j.is_number_integer()) {
    out << j.get<int64_t>();
  } else if (j.is_number_float()) {
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), j.get<double>());
    std::string text(buf, end);
    // Keep it a float on the way back: "25" would read as an integer, which a double field
    // accepts anyway, so the shortest form is fine.
    out << text;
  } else {
    out << YAML::Null;
  }
}

absl::StatusOr<Topology> FromJson(const json& j, std::string_view source,
                                  const std::map<std::string, int>* lines) {
  Topology t;
  RETURN_IF_ERROR(Decoder(source, lines).Message(j, &t, ""));
  RETURN_IF_ERROR(ValidateTopology(t, source));
  return t;
}

}  // namespace

absl::StatusOr<Topology> ParseTopologyJson(std::string_view text, std::string_view source) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    size_t line = 1;
    for (size_t i = 0; i < e.byte && i < text.size(); ++i) line += text[i] == '\n';
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(source), ": line ", line, ": malformed JSON: ", e.what()));
  } catch (const json::exception& e) {
    // E.g. out_of_range for a number that overflows a double (found by topology_json_fuzz).
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(source), ": malformed JSON: ", e.what()));
  }
  return FromJson(j, source, nullptr);
}

absl::StatusOr<Topology> ParseTopologyYaml(std::string_view text, std::string_view source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(source), ": line ", e.mark.line + 1, ": malformed YAML: ", e.msg));
  }
  std::map<std::string, int> lines;
  ASSIGN_OR_RETURN(json j, YamlToJson(root, "", lines, source));
  return FromJson(j, source, &lines);
}

std::string TopologyToJson(const Topology& topology) { return Encode(topology).dump(2) + "\n"; }

std::string TopologyToYaml(const Topology& topology) {
  YAML::Emitter out;
  EmitYaml(Encode(topology), out);
  return std::string(out.c_str()) + "\n";
}

}  // namespace tributary::topology
