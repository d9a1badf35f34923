#pragma once
// A label set: label name -> label value.
//
// std::map keeps the names sorted, which gives every sample a canonical label
// order in the exposition and lets a label set be used directly as a map key
// (prometheus-cpp uses the same type, which keeps a swap easy).

#include <map>
#include <string>

namespace tandem::metrics {

using Labels = std::map<std::string, std::string>;

}  // namespace tandem::metrics
