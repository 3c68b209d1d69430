// `braid-trace html`: one self-contained HTML file (no network, no external scripts) with
// the summary on top and a zoomable timeline below: per rank a compute lane, a
// communication lane (exposed parts red, parts hidden under compute green) and a detail
// lane (steps, transport, buckets, pipeline). Wheel zooms around the pointer, dragging
// pans, a double click resets; hovering a span shows its name, duration, bytes and
// arguments.
#pragma once

#include <string>
#include <string_view>

#include <braid/trace/summary.hpp>
#include <braid/trace/timeline.hpp>

namespace braid::tools::trace_tool {

std::string render_html(const trace::Timeline& timeline, const trace::Summary& summary,
                        std::string_view title);

}  // namespace braid::tools::trace_tool
