//! Chaos: worker processes take fenced, watchdog-renewed locks on a few hot keys
//! while the test pauses them (`SIGSTOP` past their lease), kills them and freezes
//! Redis. No two sections whose holders still believed them held at their end
//! overlap; per key, no token is issued twice and a section that ended before
//! another asked for the lock has the smaller token, lost sections included; and
//! every key makes progress once the faults stop.
//!
//! At least 10,000 sections by default; `LOCK_CHAOS_SECTIONS=100000` runs more.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::history::{History, Holding};
use lock_tests::RedisServer;
use tokio::time::Instant;

const KEYS: [&str; 3] = ["chaos:a", "chaos:b", "chaos:c"];
const WORKERS: usize = 4;
const TASKS_PER_KEY: usize = 2;
/// Longer than the workers' 300 ms lease, so a paused holder loses its lock.
const FAULT: Duration = Duration::from_millis(600);
/// The longest the test runs; the workers stop by themselves after it too.
const AT_MOST: Duration = Duration::from_secs(150);

/// One critical section as its worker reported it.
#[derive(Debug, Clone)]
struct Section {
    worker: usize,
    key: String,
    token: u64,
    asked: SystemTime,
    from: SystemTime,
    until: SystemTime,
    held: bool,
}

type Sections = Arc<Mutex<Vec<Section>>>;

struct Worker {
    child: Child,
}

impl Worker {
    fn start(number: usize, redis: &RedisServer, sections: &Sections) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_chaos-worker"))
            .args([
                redis.url(),
                KEYS.join(","),
                TASKS_PER_KEY.to_string(),
                AT_MOST.as_millis().to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a chaos worker");
        let stdout = child.stdout.take().expect("piped");
        let sections = sections.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let section = parse(number, &line);
                sections.lock().unwrap().push(section);
            }
        });
        Worker { child }
    }

    fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .arg(signal)
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill {signal} a chaos worker");
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn parse(worker: usize, line: &str) -> Section {
    let fields: Vec<&str> = line.split(' ').collect();
    let [key, token, asked, from, until, held] = fields[..] else {
        panic!("a chaos worker said {line:?}");
    };
    let time = |nanos: &str| UNIX_EPOCH + Duration::from_nanos(nanos.parse().expect("ns"));
    Section {
        worker,
        key: key.to_owned(),
        token: token.parse().expect("a token"),
        asked: time(asked),
        from: time(from),
        until: time(until),
        held: held == "true",
    }
}

/// Per key: no token twice, and every section's token is above the tokens of all
/// sections that ended before it asked for the lock, whether they kept their
/// lease or not.
fn check_token_order(sections: &[Section]) {
    for key in KEYS {
        let mut by_end: Vec<&Section> = sections.iter().filter(|s| s.key == key).collect();
        by_end.sort_by_key(|section| section.until);
        let mut by_ask = by_end.clone();
        by_ask.sort_by_key(|section| section.asked);
        let mut tokens: Vec<u64> = by_end.iter().map(|section| section.token).collect();
        tokens.sort_unstable();
        if let Some(twice) = tokens.windows(2).find(|pair| pair[0] == pair[1]) {
            panic!("`{key}`: token {} was issued twice", twice[0]);
        }
        let (mut ended, mut highest): (usize, Option<&Section>) = (0, None);
        for section in by_ask {
            while ended < by_end.len() && by_end[ended].until < section.asked {
                if highest.is_none_or(|highest| by_end[ended].token > highest.token) {
                    highest = Some(by_end[ended]);
                }
                ended += 1;
            }
            if let Some(earlier) = highest
                && earlier.token >= section.token
            {
                panic!(
                    "`{key}`: {section:?} asked after {earlier:?} had ended, yet has a token \
                     no larger"
                );
            }
        }
    }
}

fn count(sections: &Sections) -> usize {
    sections.lock().unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_sections_never_overlap_and_tokens_grow_under_faults() {
    let target: usize = std::env::var("LOCK_CHAOS_SECTIONS")
        .ok()
        .and_then(|sections| sections.parse().ok())
        .unwrap_or(10_000);
    let started = Instant::now();
    let redis = RedisServer::start();
    let sections: Sections = Arc::default();
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|number| Worker::start(number, &redis, &sections))
        .collect();
    let mut next_worker = WORKERS;

    // Faults, one kind after another, until most of the sections are done.
    let mut faults = 0;
    while faults < 6 || count(&sections) < target * 4 / 5 {
        assert!(started.elapsed() < AT_MOST / 2, "too slow under faults");
        let victim = faults % workers.len();
        match faults % 3 {
            0 => {
                workers[victim].signal("-STOP");
                tokio::time::sleep(FAULT).await;
                workers[victim].signal("-CONT");
            }
            1 => {
                workers[victim] = Worker::start(next_worker, &redis, &sections);
                next_worker += 1;
            }
            _ => {
                redis.freeze();
                tokio::time::sleep(FAULT).await;
                redis.thaw();
            }
        }
        faults += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let calm_from = SystemTime::now();

    // Progress: every key is held again, in sections that began after the faults.
    loop {
        let done = count(&sections) >= target
            && KEYS.iter().all(|key| {
                let sections = sections.lock().unwrap();
                let after = sections
                    .iter()
                    .filter(|s| s.key == *key && s.held && s.from > calm_from);
                after.count() >= 20
            });
        if done {
            break;
        }
        assert!(
            started.elapsed() < AT_MOST,
            "a key made no progress after the faults"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(workers);

    let sections = sections.lock().unwrap().clone();
    let history = History::new();
    for section in sections.iter().filter(|section| section.held) {
        history.record(Holding {
            holder: format!("worker {}", section.worker),
            key: section.key.clone(),
            from: section.from,
            until: section.until,
            fence: Some(section.token),
        });
    }
    let held = history
        .check()
        .unwrap_or_else(|violation| panic!("{violation}"));
    check_token_order(&sections);
    let lost = sections.len() - held;
    eprintln!(
        "chaos: {} sections ({held} held to the end, {lost} lost), {faults} faults, {} workers, {:.1} s",
        sections.len(),
        next_worker,
        started.elapsed().as_secs_f64()
    );
    assert!(sections.len() >= target);
}
