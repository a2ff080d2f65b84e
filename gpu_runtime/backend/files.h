// Reading the files a model version is made of: the bytes of model.txt, and the two string fields the backend
// needs from JSON it knows the shape of (meta.json's "sha256", the model config's "keel_fault_file").
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace keel {

inline bool read_file(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buf;
  buf << in.rdbuf();
  *out = buf.str();
  return true;
}

// The string value of the first "key" at or after `from` in a JSON text — meta.json as keel writes it, the model
// config as Triton serializes it. A flat scan, enough for the two string fields read here; "" when absent.
inline std::string json_string(const std::string& text, const std::string& key, size_t from = 0) {
  size_t at = text.find("\"" + key + "\"", from);
  if (at == std::string::npos) return "";
  at = text.find(':', at + key.size() + 2);
  if (at == std::string::npos) return "";
  at = text.find('"', at);
  if (at == std::string::npos) return "";
  std::string out;
  for (size_t i = at + 1; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') return out;
    if (c != '\\' || i + 1 >= text.size()) {
      out.push_back(c);
      continue;
    }
    const char e = text[++i];
    if (e == 'n') out.push_back('\n');
    else if (e == 't') out.push_back('\t');
    else if (e == 'u' && i + 4 < text.size()) {  // \u00XX: keel's paths are ASCII
      out.push_back(static_cast<char>(std::strtol(text.substr(i + 1, 4).c_str(), nullptr, 16)));
      i += 4;
    } else out.push_back(e);  // \" \\ \/
  }
  return "";
}

}  // namespace keel
