#include "html.hpp"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "html_page.hpp"

namespace braid::tools::trace_tool {
namespace {

using nlohmann::json;

std::string escape_html(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string ms(std::int64_t ns) {
  return fmt::format("{:.3f}", static_cast<double>(ns) / 1e6);
}

std::string percent(std::optional<double> p) {
  return p ? fmt::format("{:.1f}%", *p) : "-";
}

std::string summary_tables(const trace::Summary& summary) {
  // Off-core time (summary.hpp) where the compute spans carry it.
  const bool off_core = summary.job.figures.compute_off_core_ns.has_value();
  // Waiting and transfer where calls were matched across ranks (summary.hpp).
  const bool waiting = summary.job.figures.matched_calls > 0;
  std::string out =
      "<table><tr><th>rank</th><th>wall ms</th><th>compute ms</th><th>communication ms</th>"
      "<th>overlap ms</th><th>exposed ms</th>";
  if (waiting) {
    out +=
        "<th title=\"exposed time in collectives before their last rank arrived\">waiting ms</th>"
        "<th title=\"exposed time less waiting\">transfer ms</th>";
  }
  out += "<th>overlap %</th>";
  out += off_core ? "<th title=\"time the compute's threads spent without their core\">off-core "
                    "ms</th></tr>\n"
                  : "</tr>\n";
  auto row = [&](const std::string& label, const trace::OverlapFigures& f) {
    out += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
                       label, ms(f.wall_ns), ms(f.compute_ns), ms(f.communication_ns),
                       ms(f.overlap_ns), ms(f.exposed_ns));
    if (waiting) {
      out += fmt::format("<td>{}</td><td>{}</td>", ms(f.waiting_ns), ms(f.transfer_ns()));
    }
    out += fmt::format("<td>{}</td>", percent(f.overlap_percent()));
    if (off_core) {
      out += fmt::format("<td>{}</td>",
                         f.compute_off_core_ns ? ms(*f.compute_off_core_ns) : std::string("-"));
    }
    out += "</tr>\n";
  };
  for (const auto& rank : summary.ranks) row(std::to_string(rank.rank), rank.figures);
  row("all", summary.job.figures);
  out += "</table>\n";
  if (waiting) {
    out += fmt::format("<p>{}", escape_html(trace::kWaitingNote));
    if (const std::string late = trace::waiting_text(summary); !late.empty()) {
      out += fmt::format("<br>waiting: {}", escape_html(late));
    }
    out += "</p>\n";
  }
  if (!summary.job.collectives.empty()) {
    out +=
        "<table><tr><th>collective</th><th>count</th><th>bytes</th><th>p50 us</th><th>p90 us</th>"
        "<th>p99 us</th><th>max us</th></tr>\n";
    for (const auto& [name, s] : summary.job.collectives) {
      out += fmt::format(
          "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.1f}</td><td>{:.1f}</td><td>{:.1f}</td>"
          "<td>{:.1f}</td></tr>\n",
          escape_html(name), trace::count_text(s), s.bytes, static_cast<double>(s.p50_ns) / 1e3,
          static_cast<double>(s.p90_ns) / 1e3, static_cast<double>(s.p99_ns) / 1e3,
          static_cast<double>(s.max_ns) / 1e3);
    }
    out += "</table>\n";
    if (std::any_of(summary.job.collectives.begin(), summary.job.collectives.end(),
                    [](const auto& row) { return row.second.sampled(); })) {
      out += fmt::format("<p>{}</p>\n", trace::kSampledNote);
    }
  }
  if (summary.job.bubble_percent) {
    out += fmt::format("<p>pipeline bubble, mean over ranks: {:.1f}%</p>\n",
                       *summary.job.bubble_percent);
  }
  return out;
}

// Spans as flat arrays [begin, end, name index, bytes, args index, ...], by begin.
class LaneBuilder {
 public:
  LaneBuilder(std::map<std::string, int>& names, json& name_list, json& arg_list)
      : names_(names), name_list_(name_list), arg_list_(arg_list) {}

  json spans(const std::vector<const trace::TimelineEvent*>& events) {
    json flat = json::array();
    for (const trace::TimelineEvent* event : events) {
      flat.push_back(event->begin_ns);
      flat.push_back(event->end_ns);
      flat.push_back(name_index(
          event->category.empty() ? event->name : event->name + " [" + event->category + "]"));
      flat.push_back(event->bytes);
      if (event->args.empty()) {
        flat.push_back(-1);
      } else {
        std::string text;
        for (const auto& [key, value] : event->args) text += key + "=" + value + " ";
        flat.push_back(arg_list_.size());
        arg_list_.push_back(text);
      }
    }
    return flat;
  }

 private:
  int name_index(const std::string& name) {
    const auto [it, inserted] = names_.emplace(name, static_cast<int>(names_.size()));
    if (inserted) name_list_.push_back(name);
    return it->second;
  }

  std::map<std::string, int>& names_;
  json& name_list_;
  json& arg_list_;
};

json timeline_data(const trace::Timeline& timeline) {
  std::map<std::string, int> names;
  json name_list = json::array();
  json arg_list = json::array();
  LaneBuilder builder(names, name_list, arg_list);
  json ranks = json::array();
  std::int64_t end = 0;
  for (const trace::RankTimeline& rank : timeline.ranks) {
    std::vector<const trace::TimelineEvent*> compute;
    std::vector<const trace::TimelineEvent*> comm;
    std::vector<const trace::TimelineEvent*> detail;
    for (const trace::TimelineEvent& event : rank.events) {
      end = std::max(end, event.end_ns);
      if (event.instant) continue;
      if (event.category == "compute") {
        compute.push_back(&event);
      } else if (event.category == "comm") {
        comm.push_back(&event);
      } else if (event.category != "store") {
        detail.push_back(&event);
      }
    }
    json hidden = json::array();
    for (const trace::Interval& i : trace::intersection_of(trace::intervals_of(rank, "compute"),
                                                           trace::intervals_of(rank, "comm"))) {
      hidden.push_back(i.begin);
      hidden.push_back(i.end);
    }
    ranks.push_back(json{{"rank", rank.rank},
                         {"host", rank.host},
                         {"compute", builder.spans(compute)},
                         {"comm", builder.spans(comm)},
                         {"hidden", std::move(hidden)},
                         {"detail", builder.spans(detail)}});
  }
  return json{{"names", std::move(name_list)},
              {"args", std::move(arg_list)},
              {"end", end},
              {"ranks", std::move(ranks)}};
}

void replace(std::string& text, std::string_view marker, const std::string& with) {
  const auto at = text.find(marker);
  if (at != std::string::npos) text.replace(at, marker.size(), with);
}

}  // namespace

std::string render_html(const trace::Timeline& timeline, const trace::Summary& summary,
                        std::string_view title) {
  const std::string json_text = timeline_data(timeline).dump();
  // Inside a <script> element only "</" can end it early. One pass: replacing in place moved
  // the rest of the text at every match (40,000 of them took 22 s).
  std::string data;
  data.reserve(json_text.size() + json_text.size() / 16);
  for (std::size_t i = 0; i < json_text.size(); ++i) {
    data += json_text[i];
    if (json_text[i] == '<' && i + 1 < json_text.size() && json_text[i + 1] == '/') data += '\\';
  }
  std::string page(kHtmlPage);
  replace(page, "@TITLE@", escape_html(title));
  replace(page, "@TITLE@", escape_html(title));
  replace(page, "@SUMMARY@", summary_tables(summary));
  replace(page, "@DATA@", data);
  return page;
}

}  // namespace braid::tools::trace_tool
