//! The results as markdown: the table, the targets of issue 10, and how it was measured.

use std::fmt::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::peers::{self, PeerKind};
use crate::placement::Placement;
use crate::scenarios::{
    Contention, Counted, RunResult, SERIAL_LIMIT_SECTIONS, SETUP_COMMANDS, Scenario, Usage,
};
use crate::stats::{Waits, lowest_and_highest, median};

/// One implementation's runs of one scenario: the timed rounds and the counting pass.
pub(crate) struct Measured {
    pub(crate) kind: PeerKind,
    pub(crate) rounds: Vec<RunResult>,
    pub(crate) counted: Option<Result<Counted, String>>,
}

pub(crate) struct ScenarioResult {
    pub(crate) scenario: Scenario,
    pub(crate) peers: Vec<Measured>,
}

pub(crate) struct Report {
    pub(crate) results: Vec<ScenarioResult>,
    /// The "Replica sync" section, written apart.
    pub(crate) replica_sync: String,
    /// The "Newer servers beside Redis 7" section, when it ran.
    pub(crate) newer_servers: String,
    /// The "Over TLS" section, when it ran.
    pub(crate) over_tls: String,
    /// The "Keeping many locks" section, when it ran.
    pub(crate) keeping: String,
    /// The "Flash-sale demo" section, when it ran.
    pub(crate) demo: String,
    pub(crate) raw_retry: Duration,
    pub(crate) redis_version: String,
    pub(crate) placement: Placement,
    pub(crate) took: Duration,
    pub(crate) quick: bool,
    /// Whether the charts are drawn beside the report (in `chart::FOLDER`).
    pub(crate) charts: bool,
}

impl Measured {
    pub(crate) fn new(kind: PeerKind) -> Measured {
        Measured {
            kind,
            rounds: Vec::new(),
            counted: None,
        }
    }

    fn throughputs(&self) -> Vec<f64> {
        self.rounds.iter().map(RunResult::throughput).collect()
    }

    pub(crate) fn median(&self) -> Option<f64> {
        median(&self.throughputs())
    }

    /// The rounds that completed sections.
    fn rates(&self) -> Vec<f64> {
        self.throughputs()
            .into_iter()
            .filter(|rate| rate.is_finite() && *rate > 0.0)
            .collect()
    }

    /// The fastest round.
    fn best(&self) -> Option<f64> {
        self.rates().into_iter().max_by(f64::total_cmp)
    }

    /// Its fastest round over its slowest.
    fn spread(&self) -> Option<f64> {
        let rates = self.rates();
        let (lowest, highest) = lowest_and_highest(&rates);
        (rates.len() > 1).then(|| highest / lowest)
    }

    /// Whether it took part in the scenario at all.
    fn ran(&self) -> bool {
        !self.rounds.is_empty() || self.counted.is_some()
    }

    /// Over every timed round.
    pub(crate) fn waits(&self) -> Option<Waits> {
        let samples: Vec<Duration> = self
            .rounds
            .iter()
            .flat_map(|run| run.tally.waits.iter().copied())
            .collect();
        Waits::of(&samples)
    }

    /// The median over the rounds of the client's and Redis's CPU per section.
    fn cpu_per_section(&self) -> (Option<Duration>, Option<Duration>) {
        let per_section = |pick: fn(&RunResult) -> Option<Duration>| {
            let values: Vec<f64> = self
                .rounds
                .iter()
                .filter(|run| run.tally.completed > 0)
                .filter_map(|run| Some(pick(run)?.as_secs_f64() / run.tally.completed as f64))
                .collect();
            median(&values).map(Duration::from_secs_f64)
        };
        (
            per_section(|run| run.tally.usage.map(|usage| usage.cpu)),
            per_section(|run| run.redis_cpu),
        )
    }

    /// Its client CPU, Redis CPU, client thread switches, allocations and write system
    /// calls per section, as table cells.
    fn cost_cells(&self) -> String {
        let (client_cpu, redis_cpu) = self.cpu_per_section();
        let na = || "n/a".to_owned();
        let count = |of: fn(&Usage) -> u64| {
            self.usage_per_section(of)
                .map_or_else(na, |n| format!("{n:.1}"))
        };
        format!(
            "{} | {} | {} | {} | {}",
            client_cpu.map_or_else(na, micros),
            redis_cpu.map_or_else(na, micros),
            count(|usage| usage.switches),
            count(|usage| usage.allocations),
            count(|usage| usage.writes),
        )
    }

    /// The median over the rounds of a count of the client's `Usage` per section.
    fn usage_per_section(&self, count: fn(&Usage) -> u64) -> Option<f64> {
        let values: Vec<f64> = self
            .rounds
            .iter()
            .filter(|run| run.tally.completed > 0)
            .filter_map(|run| Some(count(&run.tally.usage?) as f64 / run.tally.completed as f64))
            .collect();
        median(&values)
    }

    /// The median release time over every timed round.
    fn release_p50(&self) -> Option<Duration> {
        let samples: Vec<Duration> = self
            .rounds
            .iter()
            .flat_map(|run| run.tally.releases.iter().copied())
            .collect();
        Waits::of(&samples).map(|waits| waits.p50)
    }

    fn counted(&self) -> Option<&Counted> {
        self.counted.as_ref()?.as_ref().ok()
    }

    fn per_section(&self) -> Option<f64> {
        self.counted()?.per_section()
    }

    /// lock-runtime's acquisitions made in Redis during the counting pass: each ends
    /// in one call of its release-alone script.
    fn redis_acquisitions(&self) -> Option<u64> {
        let counted = self.counted()?;
        Some(counted.counts.script(peers::library_release_sha1()))
    }

    fn runs(&self) -> impl Iterator<Item = &RunResult> {
        self.rounds.iter().chain(self.counted().map(|c| &c.run))
    }

    fn failures(&self) -> u64 {
        let counting_failed = matches!(self.counted, Some(Err(_))) as u64;
        self.runs().map(|run| run.tally.failures).sum::<u64>() + counting_failed
    }

    /// Counter checks made, and those that came out wrong.
    fn counters(&self) -> (usize, Vec<String>) {
        let checks: Vec<_> = self.runs().filter_map(|run| run.counter.as_ref()).collect();
        let wrong = checks
            .iter()
            .filter(|check| !check.is_exact())
            .map(|check| match &check.found {
                Ok(found) => format!("{found} of {}", check.expected),
                Err(error) => format!("unreadable ({error})"),
            })
            .collect();
        (checks.len(), wrong)
    }

    fn errors(&self) -> Vec<String> {
        let mut errors: Vec<String> = self
            .runs()
            .flat_map(|run| run.tally.errors.iter().cloned())
            .collect();
        if let Some(Err(error)) = &self.counted {
            errors.push(format!("counting pass: {error}"));
        }
        errors.truncate(3);
        errors
    }
}

impl ScenarioResult {
    /// The implementation with the least of its own in the way, whose rounds show
    /// how steady the machine was: the serial limit where it ran, else raw careful.
    fn gauge(&self) -> &Measured {
        let limit = self.peer(PeerKind::SerialLimit);
        match limit.rounds.is_empty() {
            true => self.peer(PeerKind::RawCareful),
            false => limit,
        }
    }

    pub(crate) fn peer(&self, kind: PeerKind) -> &Measured {
        self.peers
            .iter()
            .find(|measured| measured.kind == kind)
            .expect("every implementation is measured")
    }

    fn library(&self) -> Option<f64> {
        self.peer(PeerKind::Library).median()
    }

    /// rslock's setting with the higher median.
    fn best_rslock(&self) -> Option<PeerKind> {
        [PeerKind::RslockDefault, PeerKind::RslockFast]
            .into_iter()
            .filter_map(|kind| Some((kind, self.peer(kind).median()?)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(kind, _)| kind)
    }

    /// Why no lock could reach `at_least` times `kind`'s median here, if none could:
    /// a hot key's sections run one at a time under any lock, so none passes the
    /// serial limit, which runs them back to back with no lock at all.
    fn beyond_the_serial_limit(&self, at_least: f64, kind: PeerKind) -> Option<String> {
        let ceiling = self.peer(PeerKind::SerialLimit).best()?;
        let asked = at_least * self.peer(kind).median()?;
        (asked > ceiling).then(|| {
            format!(
                ": {} its median is {} sections/s, over the serial limit's best round \
                 ({}/s), which no lock can pass, so no lock could meet it in this run",
                ratio(at_least),
                rate(asked),
                rate(ceiling)
            )
        })
    }

    /// This library's median over `kind`'s.
    fn ratio_to(&self, kind: PeerKind) -> Option<f64> {
        self.ratio(PeerKind::Library, kind)
    }

    /// `ours`'s median over `kind`'s.
    fn ratio(&self, ours: PeerKind, kind: PeerKind) -> Option<f64> {
        Some(self.peer(ours).median()? / self.peer(kind).median()?).filter(|r| r.is_finite())
    }

    /// `ours`'s throughput over `kind`'s in each round, both run back to back.
    fn ratios_by_round(&self, ours: PeerKind, kind: PeerKind) -> Vec<f64> {
        let ours = self.peer(ours).throughputs();
        let other = self.peer(kind).throughputs();
        ours.iter()
            .zip(&other)
            .filter(|(_, other)| **other > 0.0)
            .map(|(ours, other)| ours / other)
            .collect()
    }
}

/// A goal of issue 19: `ours` at `at_least` times what it is compared with.
struct Goal {
    slug: &'static str,
    ours: PeerKind,
    against: Against,
    at_least: f64,
    /// An earlier issue's goal, kept.
    holds: bool,
}

#[derive(Clone, Copy)]
enum Against {
    Peer(PeerKind),
    BestRslock,
    SerialLimitBest,
}

const GOALS: [Goal; 9] = [
    Goal::new(
        "uncontended-1",
        PeerKind::LibraryFixed,
        Against::Peer(PeerKind::RawCareful),
        0.95,
    ),
    Goal::new(
        "uncontended-64",
        PeerKind::LibraryFixed,
        Against::Peer(PeerKind::RawCareful),
        0.95,
    ),
    Goal::held("hot-256", PeerKind::Library, Against::BestRslock, 5.0),
    Goal::held("hot-256", PeerKind::Library, Against::SerialLimitBest, 0.5),
    Goal::new("hot-1000", PeerKind::Library, Against::BestRslock, 4.0),
    Goal::new("hot-1000", PeerKind::Library, Against::SerialLimitBest, 0.6),
    Goal::new("hot-256", PeerKind::LibraryFixed, Against::BestRslock, 4.0),
    Goal::held(
        "processes-4x64",
        PeerKind::Library,
        Against::BestRslock,
        3.0,
    ),
    Goal::new(
        "processes-4x64",
        PeerKind::LibraryFixed,
        Against::BestRslock,
        3.5,
    ),
];

impl Goal {
    const fn new(slug: &'static str, ours: PeerKind, against: Against, at_least: f64) -> Goal {
        Goal {
            slug,
            ours,
            against,
            at_least,
            holds: false,
        }
    }

    const fn held(slug: &'static str, ours: PeerKind, against: Against, at_least: f64) -> Goal {
        Goal {
            holds: true,
            ..Goal::new(slug, ours, against, at_least)
        }
    }
}

impl Report {
    pub(crate) fn counters_exact(&self) -> bool {
        self.results
            .iter()
            .flat_map(|result| &result.peers)
            .all(|measured| measured.counters().1.is_empty())
    }

    fn result(&self, slug: &str) -> Option<&ScenarioResult> {
        self.results
            .iter()
            .find(|result| result.scenario.slug == slug)
    }

    pub(crate) fn label(&self, kind: PeerKind) -> String {
        kind.label(self.raw_retry)
    }

    pub(crate) fn markdown(&self) -> String {
        let mut out = String::new();
        self.write_header(&mut out);
        self.write_table(&mut out);
        self.write_charts(&mut out);
        self.write_hand_offs(&mut out);
        self.write_shares(&mut out);
        self.write_targets(&mut out);
        out.push_str(&self.replica_sync);
        out.push_str(&self.newer_servers);
        out.push_str(&self.over_tls);
        out.push_str(&self.keeping);
        out.push_str(&self.demo);
        self.write_method(&mut out);
        self.write_breakdown(&mut out);
        self.write_rounds(&mut out);
        self.write_errors(&mut out);
        out
    }

    fn write_header(&self, out: &mut String) {
        let _ = writeln!(out, "# Benchmarks\n");
        if self.quick {
            let _ = writeln!(
                out,
                "> A `--quick` run: small counts and one round, for trying the bench out. \
                 Not the numbers to quote.\n"
            );
        }
        let _ = writeln!(
            out,
            "Written by `lock-bench` on {} (UTC), in {:.1} minutes. To reproduce, from the \
             repository root:\n\n```sh\nscripts/bench\n```\n",
            today(),
            self.took.as_secs_f64() / 60.0
        );
        let _ = writeln!(
            out,
            "**The machine:** {} cores, shared with other work and noisy; redis-server {} \
             started by the bench on a free loopback port. {} Read the medians and the ratios \
             between implementations run back to back, not the absolute times: another run \
             here can move every number by tens of percent.\n",
            self.placement.cores(),
            self.redis_version,
            self.placement.described()
        );
    }

    /// Per-process fairness where several processes share the hot key.
    fn write_shares(&self, out: &mut String) {
        let several = self
            .results
            .iter()
            .filter(|result| result.scenario.processes > 1);
        let mut lines = Vec::new();
        for result in several {
            for measured in result
                .peers
                .iter()
                .filter(|measured| !measured.rounds.is_empty())
            {
                let rounds: Vec<String> = measured
                    .rounds
                    .iter()
                    .filter(|run| !run.tally.shares.is_empty())
                    .map(|run| {
                        let shares: Vec<String> = run
                            .tally
                            .shares
                            .iter()
                            .map(|share| format!("{share:.2}"))
                            .collect();
                        shares.join(" / ")
                    })
                    .collect();
                if rounds.is_empty() {
                    continue;
                }
                let all: Vec<f64> = measured
                    .rounds
                    .iter()
                    .flat_map(|run| run.tally.shares.iter().copied())
                    .collect();
                let (lowest, highest) = lowest_and_highest(&all);
                lines.push(format!(
                    "| {} | {} | {lowest:.2} | {highest:.2} | {} |",
                    result.scenario.name,
                    self.label(measured.kind),
                    rounds.join("; ")
                ));
            }
        }
        if lines.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "## Shares per process
"
        );
        let _ = writeln!(
            out,
            "Each process's sections done while every process was still running (until \
             the first one finished its work), against an equal split: 1.00 is a fair share.\n"
        );
        let _ = writeln!(
            out,
            "| Scenario | Implementation | Lowest | Highest | Round by round |\n|---|---|--:|--:|---|"
        );
        for line in lines {
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(out);
    }

    fn write_table(&self, out: &mut String) {
        let _ = writeln!(out, "## Results\n");
        let _ = writeln!(
            out,
            "| Scenario | Implementation | Sections/s (median) | lock-runtime ÷ it | \
             Requests / section | Wait p50 | Wait p99 | Wait max | CPU / section: client + Redis | \
             Counter | Failures |"
        );
        let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|--:|--:|---|--:|");
        for result in &self.results {
            for measured in result.peers.iter().filter(|measured| measured.ran()) {
                let scenario = if measured.kind == PeerKind::Library {
                    format!("**{}**", result.scenario.name)
                } else {
                    String::new()
                };
                let ratio = match measured.kind {
                    PeerKind::Library => "—".to_owned(),
                    // The ceiling: its best round.
                    PeerKind::SerialLimit => result
                        .library()
                        .zip(measured.best())
                        .map_or("n/a".to_owned(), |(library, best)| ratio(library / best)),
                    kind => result.ratio_to(kind).map_or("n/a".to_owned(), ratio),
                };
                let sections_per_second = match (measured.kind, measured.median()) {
                    (_, None) => "n/a".to_owned(),
                    (PeerKind::SerialLimit, Some(median)) => format!(
                        "{} (best {})",
                        rate(median),
                        measured.best().map_or("n/a".to_owned(), rate)
                    ),
                    (_, Some(median)) => rate(median),
                };
                let waits = measured.waits();
                let wait = |pick: fn(&Waits) -> Duration| {
                    waits.as_ref().map_or("n/a".to_owned(), |w| millis(pick(w)))
                };
                let (checks, wrong) = measured.counters();
                let counter = match (result.scenario.contention, checks, wrong.first()) {
                    (Contention::DistinctKeys, ..) => "—".to_owned(),
                    (_, 0, _) => "not checked".to_owned(),
                    (_, _, None) => "exact".to_owned(),
                    (_, _, Some(first)) => {
                        format!("**WRONG** in {} of {checks} runs: {first}", wrong.len())
                    }
                };
                let cpu = match measured.cpu_per_section() {
                    (Some(client), Some(redis)) => {
                        format!("{} + {}", micros(client), micros(redis))
                    }
                    _ => "n/a".to_owned(),
                };
                let _ = writeln!(
                    out,
                    "| {scenario} | {} | {sections_per_second} | {ratio} | {} | {} | {} | {} | {cpu} | {counter} | {} |",
                    self.label(measured.kind),
                    measured
                        .per_section()
                        .map_or("n/a".to_owned(), |n| format!("{n:.2}")),
                    wait(|w| w.p50),
                    wait(|w| w.p99),
                    wait(|w| w.max),
                    measured.failures(),
                );
            }
        }
        let describe: Vec<String> = self
            .results
            .iter()
            .map(|result| {
                let s = &result.scenario;
                let shape = if s.processes > 1 {
                    format!(
                        "{} processes × {} tasks × {}",
                        s.processes, s.tasks, s.sections
                    )
                } else {
                    format!("{} × {}", s.tasks, s.sections)
                };
                let plural = if s.rounds == 1 { "" } else { "s" };
                format!("{}: {shape}, {} round{plural}", s.name, s.rounds)
            })
            .collect();
        let _ = writeln!(
            out,
            "\nSections/s: completed critical sections per second (uncontended: \
             acquire-and-release pairs, with no section), the median of the rounds, timed \
             from releasing all tasks at once until the last one finishes; for the serial \
             limit, also its best round. Tasks × sections each: {}; the serial limit runs a \
             hot-key scenario's sections in one task, and at least {SERIAL_LIMIT_SECTIONS} \
             of them a round, long enough to tell by it whether the machine's speed \
             changed. The hot-key rounds are \
             bursts: every task asks at once and runs its few sections, so a round ends \
             with few tasks left waiting, where an implementation that sleeps between \
             tries leaves the lock idle. Their goals are set on those rounds. The steady \
             rounds run hot-256's tasks four times as long, as a service under constant \
             load would, and the sleepers idle less of those. lock-runtime ÷ it: \
             lock-runtime's median over this row's median; over the serial limit's best \
             round, the ceiling issue 10 takes. Requests / section: top-level requests sent \
             to Redis per completed section, counted in a separate pass through a counting \
             proxy; 2 of them are a hot-key section's own GET and SET, and an uncontended \
             pair that asks Redis to acquire and to release sends 2. Wait: from calling acquire to holding the lock, over every acquire \
             of the timed rounds. CPU / section: the CPU time the implementation's \
             process(es) and redis-server used in a round over its sections, the median of \
             the rounds (CPU is what throughput runs out of here). Failures: acquires, sections or releases that returned an \
             error, over all rounds and the counting pass.\n",
            describe.join("; ")
        );
    }

    /// The charts of the hot-key rows, drawn from the table's figures.
    fn write_charts(&self, out: &mut String) {
        let hot_rows = self.results.iter().any(|result| {
            result.scenario.contention == Contention::HotKey && result.scenario.processes == 1
        });
        if !self.charts || !hot_rows {
            return;
        }
        let _ = writeln!(
            out,
            "## Charts

The hot-key rows above, in one process, drawn by `lock-bench` \
             from the same rounds when it wrote this report (both axes logarithmic): \
             sections per second (medians) against the number of tasks, then the waits' \
             p50 and p99. The serial limit never waits, so it has no line in the second.\n\n\
             ![Hot key: sections per second against tasks]({folder}/{throughput})\n\n\
             ![Hot key: wait p50 and p99 against tasks]({folder}/{waits})\n",
            folder = crate::chart::FOLDER,
            throughput = crate::chart::THROUGHPUT,
            waits = crate::chart::WAITS,
        );
    }

    /// lock-runtime's sections per acquisition in Redis, where the key is hot.
    fn write_hand_offs(&self, out: &mut String) {
        let mut lines = Vec::new();
        for result in &self.results {
            if result.scenario.contention != Contention::HotKey {
                continue;
            }
            let library = result.peer(PeerKind::Library);
            let (Some(counted), Some(acquisitions)) =
                (library.counted(), library.redis_acquisitions())
            else {
                continue;
            };
            let sections = counted.run.tally.completed;
            let (per_acquisition, hand_offs) = if acquisitions == 0 {
                let none = "n/a: no call of the release-alone script seen".to_owned();
                (none.clone(), none)
            } else {
                let per_acquisition = sections as f64 / acquisitions as f64;
                (
                    format!("{per_acquisition:.2}"),
                    format!("**{:.2}**", per_acquisition - 1.0),
                )
            };
            lines.push(format!(
                "| {} | {sections} | {acquisitions} | {per_acquisition} | {hand_offs} |",
                result.scenario.name
            ));
        }
        if lines.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "## Hand-offs per Redis acquisition (lock-runtime)\n\n\
             From the counting pass: every acquisition lock-runtime makes in Redis ends in \
             one call of its release-alone script, the compare-and-delete every release \
             starts with on Redis 7 (told apart from its other scripts by SHA1), \
             so sections over those calls is the sections each Redis acquisition served, \
             and all but the first of them were handed on from task to task inside a \
             client. The client's defaults allow at most {} hand-offs within {} ms while \
             another client waits in Redis; halfway through, one `GET` tells the client \
             whether one does, and if none does, the count and the clock start again.\n\n\
             | Scenario | Sections counted | Redis acquisitions (release-alone calls) | Sections per Redis acquisition | Hand-offs per Redis acquisition |\n\
             |---|--:|--:|--:|--:|",
            lock_runtime::DEFAULT_HAND_OFFS,
            lock_runtime::DEFAULT_HAND_OFF_WINDOW.as_millis(),
        );
        for line in lines {
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(out);
    }

    fn write_targets(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "## Targets (issue 19)\n\n\
             Each goal compares two implementations run back to back in the same rounds. \
             It is met only when both the ratio of their medians and the median of the \
             round-by-round ratios reach it. Against the serial limit, the ceiling is its \
             best round. \"Holds\" rows keep an earlier goal (issue 10's). A goal is not \
             settled either when the machine's speed changed within its scenario (when the \
             fastest round of the serial limit, on the hot key, or of raw careful, \
             uncontended, which have nothing of ours in the way, was over {UNSTEADY}× \
             their slowest), unless every round's ratio reached it: against the serial \
             limit, each of our rounds over its best.\n\n\
             | Scenario | Ours | Against | Ratio of medians | Median of the rounds' ratios | Goal | |\n\
             |---|---|---|--:|--:|--:|---|"
        );
        for goal in &GOALS {
            let _ = writeln!(out, "{}", self.goal_row(goal));
        }
        let _ = writeln!(
            out,
            "\nThe flash-sale demo's goal is under its own heading below.\n"
        );
        self.write_everyday_pair(out);
        self.write_hot_key_sections(out);
        self.write_counters_check(out);
    }

    fn goal_row(&self, goal: &Goal) -> String {
        let scenario = goal.slug;
        let Some(result) = self.result(goal.slug) else {
            return format!(
                "| {scenario} | {} | | | | {} | not measured in this run |",
                self.label(goal.ours),
                ratio(goal.at_least)
            );
        };
        let ours = result.peer(goal.ours);
        let (against, of_medians, rounds) = match goal.against {
            Against::Peer(peer) => (
                Some(peer),
                result.ratio(goal.ours, peer),
                result.ratios_by_round(goal.ours, peer),
            ),
            Against::BestRslock => match result.best_rslock() {
                Some(best) => (
                    Some(best),
                    result.ratio(goal.ours, best),
                    result.ratios_by_round(goal.ours, best),
                ),
                None => (None, None, Vec::new()),
            },
            Against::SerialLimitBest => {
                let best = result.peer(PeerKind::SerialLimit).best();
                let of_best = ours.median().zip(best).map(|(ours, best)| ours / best);
                let rounds = best.map_or_else(Vec::new, |best| {
                    ours.rates().into_iter().map(|rate| rate / best).collect()
                });
                (Some(PeerKind::SerialLimit), of_best, rounds)
            }
        };
        let (met, mut verdict) = settle(of_medians, &rounds, goal.at_least);
        if let Some(beyond) = against
            .filter(|&against| !met && against != PeerKind::SerialLimit)
            .and_then(|against| result.beyond_the_serial_limit(goal.at_least, against))
        {
            verdict.push_str(&beyond);
        }
        let gauge = result.gauge();
        if of_medians.is_some()
            && let Some(spread) = gauge.spread().filter(|&spread| spread > UNSTEADY)
        {
            let changed = format!(
                "the machine's speed changed within the scenario ({}'s fastest round was \
                 {spread:.1}× its slowest)",
                self.label(gauge.kind)
            );
            let every_round_met =
                !rounds.is_empty() && rounds.iter().all(|&round| round >= goal.at_least);
            verdict = if met && every_round_met {
                format!("**met** in every round, though {changed}")
            } else {
                format!("**not settled**: {changed}, so this run cannot tell")
            };
        }
        let against = match (goal.against, against) {
            (Against::SerialLimitBest, _) => "the serial limit's best round".to_owned(),
            (Against::BestRslock, Some(best)) => format!("rslock's best: {}", self.label(best)),
            (_, Some(peer)) => self.label(peer),
            (_, None) => "n/a".to_owned(),
        };
        format!(
            "| {} | {} | {against} | {} | {} | {}{} | {verdict} |",
            result.scenario.name,
            self.label(goal.ours),
            of_medians.map_or("n/a".to_owned(), ratio),
            median(&rounds).map_or("n/a".to_owned(), ratio),
            ratio(goal.at_least),
            if goal.holds { " (holds)" } else { "" },
        )
    }

    /// What one uncontended acquire-and-release pair costs each implementation.
    fn write_everyday_pair(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "### The everyday pair, broken down\n\n\
             Per acquire-and-release pair, medians of the timed rounds: the wall time of \
             each call, the CPU the client process and redis-server used, the times the \
             client's threads were put on a CPU (each one a thread woken or preempted), \
             the client's heap allocations, the client's write system calls (each one \
             sends what was queued on a socket: redis-rs's connection writes each \
             request as it comes, on its own), and Redis's own time for the pair's \
             commands (`INFO commandstats`, from the counting pass). Timers armed, by \
             construction rather than measured: lock-runtime none per request on its own \
             connection, which one watcher per connection looks at every quarter of the \
             bound (one per request on an application's `ConnectionManager` or a \
             Cluster); the careful raw protocol none; raw through a `ConnectionManager` \
             with a response timeout one per request.\n\n\
             | Scenario | Implementation | Acquire p50 | Release p50 | Client CPU | Redis CPU | Thread switches | Allocations | Writes | Redis's time |\n\
             |---|---|--:|--:|--:|--:|--:|--:|--:|--:|"
        );
        for slug in ["uncontended-1", "uncontended-64"] {
            let Some(result) = self.result(slug) else {
                continue;
            };
            for measured in result.peers.iter().filter(|measured| measured.ran()) {
                let na = || "n/a".to_owned();
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} |",
                    result.scenario.name,
                    self.label(measured.kind),
                    measured.waits().map_or_else(na, |w| micros(w.p50)),
                    measured.release_p50().map_or_else(na, micros),
                    measured.cost_cells(),
                    measured
                        .counted()
                        .and_then(Counted::server_time_per_section)
                        .map_or_else(na, micros),
                );
            }
        }
        let _ = writeln!(out);
    }

    /// What a section on the hot key costs each implementation, beside the section
    /// alone.
    fn write_hot_key_sections(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "### The hot key, broken down\n\n\
             Per section on the hot key in one process, medians of the timed rounds, \
             measured as for the pair above. The serial limit is the section alone (its \
             GET and SET, two round trips) run by one task with no lock, so what a lock \
             adds to a section is its difference from that row. A round also starts its \
             tasks, about 7 allocations each, spread over the sections each task runs \
             (20 at 16 tasks, 4 at 256, 1 at 1,000): that, not the number of tasks \
             waiting, is why the allocations a section rise down the rows.\n\n\
             | Scenario | Implementation | Client CPU | Redis CPU | Thread switches | Allocations | Writes |\n\
             |---|---|--:|--:|--:|--:|--:|"
        );
        for slug in ["hot-16", "hot-256", "hot-1000"] {
            let Some(result) = self.result(slug) else {
                continue;
            };
            for measured in result.peers.iter().filter(|measured| measured.ran()) {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} |",
                    result.scenario.name,
                    self.label(measured.kind),
                    measured.cost_cells(),
                );
            }
        }
        let _ = writeln!(out);
    }

    fn write_counters_check(&self, out: &mut String) {
        let mut lines = Vec::new();
        let mut checks = 0;
        for result in &self.results {
            for measured in &result.peers {
                let (made, wrong) = measured.counters();
                checks += made;
                if !wrong.is_empty() {
                    lines.push(format!(
                        "{} / {}: wrong in {} of {made} runs, e.g. {}",
                        result.scenario.name,
                        self.label(measured.kind),
                        wrong.len(),
                        wrong[0]
                    ));
                }
            }
        }
        if lines.is_empty() {
            let _ = writeln!(
                out,
                "Counters, checked in every run: every hot-key counter of every \
                 implementation, in every round and counting pass, came out exact ({checks} \
                 checks).\n"
            );
        } else {
            let _ = writeln!(
                out,
                "Counters, checked in every run: **some came out wrong**:\n{}",
                bullets(&lines)
            );
        }
    }

    fn write_method(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "## How it was measured\n\n\
             Every implementation runs the same code (`bench/src/scenarios.rs`): the tasks \
             wait on a barrier, then each takes the lock, runs its section, and releases, as \
             many times as the scenario says. One client per implementation per process, \
             shared by its tasks; the sections' GET and SET go through a separate \
             connection. Every lease is {} s, so nothing expires during a run. The rounds \
             interleave the implementations, a different one first each round. The several \
             processes scenario re-runs this binary as {} worker processes against the same \
             redis-server; they connect and warm up, then the parent starts them together \
             and times until the last one reports.\n",
            peers::LEASE.as_secs(),
            self.results
                .iter()
                .map(|r| r.scenario.processes)
                .max()
                .unwrap_or(1),
        );
        let _ = writeln!(
            out,
            "- **{}**: lock-runtime with its default features (no `tracing`, no \
             `metrics`), `LockClient::connect` with the default `ClientConfig` (hand-off \
             within a client: at most {} hand-offs within {} ms while another client waits \
             in Redis, which one `GET` halfway tells), \
             then `acquire` and `release` with `LockOptions::new().timeout({} s)`: the \
             default watchdog lease and unbounded retries within the timeout. Its fixed \
             lease row takes `lease(10 s)` instead, with no watchdog.",
            self.label(PeerKind::Library),
            lock_runtime::DEFAULT_HAND_OFFS,
            lock_runtime::DEFAULT_HAND_OFF_WINDOW.as_millis(),
            peers::ACQUIRE_CAP.as_secs()
        );
        let _ = writeln!(
            out,
            "- **{}**: `SET key token NX PX 30000` on a redis-rs `ConnectionManager` (which \
             reconnects, with 2 s bounds on connecting and on each answer), retried after a fixed \
             {} ms sleep while the key is taken; released by a compare-and-delete Lua script \
             through `redis::Script` (EVALSHA).",
            self.label(PeerKind::Raw),
            self.raw_retry.as_millis()
        );
        let _ = writeln!(
            out,
            "- **{}**: the bar issue 19 sets, what a careful user writes by hand: one redis-rs \
             `MultiplexedConnection` with no response timeout (redis-rs bounds each answer by \
             500 ms unless told not to, a timer per request), a uuid v4 token, \
             `SET key token NX PX 10000`, and the same compare-and-delete by `EVALSHA`. Both \
             raw peers read the bench's {} s cap between tries, so a lock granted at once \
             arms no timer.",
            self.label(PeerKind::RawCareful),
            peers::ACQUIRE_CAP.as_secs()
        );
        let _ = writeln!(
            out,
            "- **rslock 0.10** on one Redis: `LockManager::lock` and `unlock`, with \
             `set_retry({}, delay)`, where the delay is its default {} ms or {} ms. rslock \
             sleeps a random 0 to delay between tries, and a failed try also runs its unlock \
             script. {} tries never ran out here; any acquire of any implementation is \
             also cut off by the bench after {} s and counted as a failure.",
            peers::RSLOCK_RETRIES,
            peers::RSLOCK_DEFAULT_DELAY.as_millis(),
            peers::RSLOCK_FAST_DELAY.as_millis(),
            peers::RSLOCK_RETRIES,
            peers::ACQUIRE_CAP.as_secs()
        );
        let _ = writeln!(
            out,
            "- **Waits** differ in kind: with raw and rslock whichever try comes first \
             wins, often from the task that has just released, so their median wait is \
             tiny and their p99 and maximum long. Compare the p99 and the maximum."
        );
        let _ = writeln!(
            out,
            "- **Requests** are counted by `lock_tests::CountingProxy`, a loopback proxy \
             that parses the RESP requests from client to server and counts top-level \
             commands (what runs inside a script is not counted, unlike `INFO \
             commandstats`). The counting pass is a separate run of the scenario, with \
             every client of the implementation and the data connection going through the \
             proxy; the count starts after they have connected and warmed up, and {} are \
             left out wherever they come. SUBSCRIBE, UNSUBSCRIBE and SCRIPT LOAD count. \
             EVALSHA is also counted by script, told apart by the SHA1 of the scripts \
             the bench knows: lock-runtime's acquire and release scripts, hashed at build \
             time from `lock-runtime/src/backend/scripts/`, and raw's \
             compare-and-delete.\n",
            SETUP_COMMANDS.join(", ")
        );
    }

    fn write_breakdown(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "## Requests per section, by command (counting pass)\n\n\
             SET and GET include the section's own SET and GET; EVALSHA names its \
             script where the bench knows it. Redis's time: the \
             microseconds `INFO commandstats` adds up for the top-level commands of the \
             pass (a script's time includes the commands it runs), per section; given for \
             the uncontended scenarios only, where no command is sent both at top level \
             and from a script.\n\n\
             | Scenario | Implementation | Sections counted | Requests / section | Redis's time / section |\n\
             |---|---|--:|---|--:|"
        );
        for result in &self.results {
            for measured in result.peers.iter().filter(|measured| measured.ran()) {
                let server = match (result.scenario.contention, measured.counted()) {
                    (Contention::DistinctKeys, Some(counted)) => counted
                        .server_time_per_section()
                        .map_or("n/a".to_owned(), micros),
                    _ => "—".to_owned(),
                };
                let (sections, detail) = match &measured.counted {
                    Some(Ok(counted)) => (
                        counted.run.tally.completed.to_string(),
                        breakdown(measured).unwrap_or_else(|| "n/a".to_owned()),
                    ),
                    Some(Err(error)) => ("0".to_owned(), format!("failed: {error}")),
                    None => ("0".to_owned(), "not run".to_owned()),
                };
                let _ = writeln!(
                    out,
                    "| {} | {} | {sections} | {detail} | {server} |",
                    result.scenario.name,
                    self.label(measured.kind)
                );
            }
        }
        let _ = writeln!(out);
    }

    fn write_rounds(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "## Every round\n\n| Scenario | Implementation | Sections/s, round by round |\n|---|---|---|"
        );
        for result in &self.results {
            for measured in result.peers.iter().filter(|measured| measured.ran()) {
                let rounds: Vec<String> = measured.throughputs().into_iter().map(rate).collect();
                let _ = writeln!(
                    out,
                    "| {} | {} | {} |",
                    result.scenario.name,
                    self.label(measured.kind),
                    rounds.join(", ")
                );
            }
        }
        let _ = writeln!(out);
    }

    fn write_errors(&self, out: &mut String) {
        let mut lines = Vec::new();
        for result in &self.results {
            for measured in &result.peers {
                for error in measured.errors() {
                    lines.push(format!(
                        "{} / {}: {}",
                        result.scenario.name,
                        self.label(measured.kind),
                        error.replace('|', "\\|")
                    ));
                }
            }
        }
        if !lines.is_empty() {
            let _ = writeln!(out, "## Errors (first few)\n\n{}", bullets(&lines));
        }
    }
}

/// Each command's requests per section, most frequent first, set-up left out.
fn breakdown(measured: &Measured) -> Option<String> {
    let counted = measured.counted()?;
    let sections = counted.run.tally.completed;
    if sections == 0 {
        return None;
    }
    let mut commands: Vec<(String, u64)> = Vec::new();
    let mut unnamed_scripts = counted.counts.get("EVALSHA");
    for (sha1, count) in counted.counts.scripts() {
        if let Some(name) = peers::script_name(sha1) {
            commands.push((format!("EVALSHA {name}"), count));
            unnamed_scripts = unnamed_scripts.saturating_sub(count);
        }
    }
    commands.extend(
        counted
            .counts
            .iter()
            .filter(|(name, _)| !SETUP_COMMANDS.contains(name) && *name != "EVALSHA")
            .map(|(name, count)| (name.to_owned(), count)),
    );
    if unnamed_scripts > 0 {
        commands.push(("EVALSHA".to_owned(), unnamed_scripts));
    }
    commands.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let parts: Vec<String> = commands
        .iter()
        .map(|(name, count)| format!("{name} {:.2}", *count as f64 / sections as f64))
        .collect();
    Some(parts.join(", "))
}

/// How much faster than its slowest round the gauge's fastest may be for a run to
/// settle a goal: this machine, shared, at times runs a while several times slower.
const UNSTEADY: f64 = 1.5;

/// Met only when the ratio of the medians and the median of the round-by-round
/// ratios (each round runs the implementations back to back) both reach `target`.
fn settle(of_medians: Option<f64>, rounds: &[f64], target: f64) -> (bool, String) {
    let Some(of_medians) = of_medians else {
        return (false, "**not measured**".to_owned());
    };
    let of_rounds = median(rounds).unwrap_or(of_medians);
    match (of_medians >= target, of_rounds >= target) {
        (true, true) => (true, verdict(true).to_owned()),
        (false, false) => (false, verdict(false).to_owned()),
        (by_medians, _) => (
            false,
            format!(
                "**not settled**: the ratio of the medians {} the target and the median \
                 round ({}) {}, so this run cannot tell",
                if by_medians { "meets" } else { "misses" },
                ratio(of_rounds),
                if by_medians { "misses it" } else { "meets it" },
            ),
        ),
    }
}

fn verdict(met: bool) -> &'static str {
    if met { "**met**" } else { "**missed**" }
}

fn bullets(lines: &[String]) -> String {
    let mut out = String::new();
    for line in lines {
        let _ = writeln!(out, "   - {line}");
    }
    out
}

pub(crate) fn ratio(value: f64) -> String {
    format!("{value:.2}×")
}

/// A rate with thousands separators.
pub(crate) fn rate(value: f64) -> String {
    let whole = value.round() as u64;
    let digits = whole.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn micros(duration: Duration) -> String {
    let us = duration.as_secs_f64() * 1e6;
    if us < 100.0 {
        format!("{us:.1} µs")
    } else {
        format!("{us:.0} µs")
    }
}

fn millis(duration: Duration) -> String {
    let ms = duration.as_secs_f64() * 1e3;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 1_000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.2} s", ms / 1e3)
    }
}

/// Today's date, `YYYY-MM-DD` in UTC.
fn today() -> String {
    let days = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs() / 86_400) as i64;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::Tally;

    /// A hot-key scenario whose implementations ran at these rates, one round each.
    fn hot_key(rates: &[(PeerKind, u64)]) -> ScenarioResult {
        let measured = |kind| Measured {
            kind,
            rounds: rates
                .iter()
                .filter(|(rated, _)| *rated == kind)
                .map(|&(_, completed)| RunResult {
                    tally: Tally {
                        completed,
                        ..Tally::default()
                    },
                    elapsed: Duration::from_secs(1),
                    counter: None,
                    redis_cpu: None,
                })
                .collect(),
            counted: None,
        };
        ScenarioResult {
            scenario: Scenario {
                name: "Hot key".to_owned(),
                slug: "hot-256",
                processes: 1,
                tasks: 256,
                sections: 4,
                contention: Contention::HotKey,
                rounds: 1,
            },
            peers: PeerKind::ALL.into_iter().map(measured).collect(),
        }
    }

    #[test]
    fn a_goal_past_the_serial_limit_says_no_lock_could_meet_it() {
        let result = hot_key(&[
            (PeerKind::Library, 8_900),
            (PeerKind::RslockFast, 2_000),
            (PeerKind::SerialLimit, 9_000),
        ]);
        let beyond = result.beyond_the_serial_limit(5.0, PeerKind::RslockFast);
        assert_eq!(
            beyond.as_deref(),
            Some(
                ": 5.00× its median is 10,000 sections/s, over the serial limit's best round \
                 (9,000/s), which no lock can pass, so no lock could meet it in this run"
            )
        );
        assert_eq!(
            result.beyond_the_serial_limit(4.0, PeerKind::RslockFast),
            None
        );
        // Without a serial limit (the uncontended scenarios), nothing is said.
        let uncontended = hot_key(&[(PeerKind::Library, 8_900), (PeerKind::RawCareful, 9_500)]);
        assert_eq!(
            uncontended.beyond_the_serial_limit(0.95, PeerKind::RawCareful),
            None
        );
    }

    fn report_of(result: ScenarioResult) -> Report {
        Report {
            results: vec![result],
            replica_sync: String::new(),
            newer_servers: String::new(),
            over_tls: String::new(),
            keeping: String::new(),
            demo: String::new(),
            raw_retry: Duration::from_millis(50),
            redis_version: String::new(),
            placement: Placement::Shared {
                cores: 2,
                why: String::new(),
            },
            took: Duration::ZERO,
            quick: false,
            charts: false,
        }
    }

    #[test]
    fn an_unsteady_machine_settles_a_goal_only_when_every_round_reaches_it() {
        let limit_goal = &GOALS[3];
        assert!(matches!(limit_goal.against, Against::SerialLimitBest));
        // The serial limit's fastest round is 1.6× its slowest: the machine changed speed.
        let limit = [6_000, 9_600, 7_000].map(|rate| (PeerKind::SerialLimit, rate));
        let rounds_of = |ours: [u64; 3]| {
            let ours = ours.map(|rate| (PeerKind::Library, rate));
            report_of(hot_key(&[ours, limit].concat()))
        };
        // Each of ours over the limit's best (9,600) is at least 0.5.
        let every_round = rounds_of([5_000, 6_000, 4_900]).goal_row(limit_goal);
        assert!(
            every_round.contains("| **met** in every round, though"),
            "{every_round}"
        );
        // The median reaches it, one round does not.
        let one_round_short = rounds_of([5_000, 6_000, 4_700]).goal_row(limit_goal);
        assert!(
            one_round_short.contains("| **not settled**: the machine's speed"),
            "{one_round_short}"
        );
        // A steady machine goes by the median.
        let steady = report_of(hot_key(&[
            (PeerKind::Library, 5_000),
            (PeerKind::Library, 6_000),
            (PeerKind::Library, 4_700),
            (PeerKind::SerialLimit, 9_000),
            (PeerKind::SerialLimit, 9_600),
            (PeerKind::SerialLimit, 8_000),
        ]));
        assert!(steady.goal_row(limit_goal).contains("| **met** |"));
    }

    #[test]
    fn formats() {
        assert_eq!(rate(1_234_567.4), "1,234,567");
        assert_eq!(rate(999.0), "999");
        assert_eq!(millis(Duration::from_micros(1_234)), "1.23 ms");
        assert_eq!(millis(Duration::from_millis(2_500)), "2.50 s");
        assert_eq!(today().len(), 10);
    }
}
