//! A worker process of the several-processes scenario: connects, says `READY`,
//! waits for `GO` on stdin, runs its tasks on the hot key and reports on stdout.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use crate::peers::PeerKind;
use crate::scenarios::{Contention, Participant, format_done};

struct WorkerArgs {
    kind: PeerKind,
    url: String,
    prefix: String,
    tasks: usize,
    sections: usize,
    raw_retry: Duration,
}

pub(crate) fn main(args: &[String]) -> ExitCode {
    let args = match parse(args) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("lock-bench worker: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("lock-bench worker: no runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let participant =
        match runtime.block_on(Participant::connect(args.kind, &args.url, args.raw_retry)) {
            Ok(participant) => participant,
            Err(error) => {
                println!("could not connect: {error}");
                return ExitCode::FAILURE;
            }
        };
    say("READY");
    let mut go = String::new();
    if std::io::stdin().lock().read_line(&mut go).is_err() || go.trim() != "GO" {
        return ExitCode::FAILURE;
    }
    let (tally, _elapsed) = runtime.block_on(participant.run(
        &args.prefix,
        args.tasks,
        args.sections,
        Contention::HotKey,
    ));
    for error in &tally.errors {
        say(&format!("ERROR {}", error.replace('\n', " ")));
    }
    say(&format_done(&tally));
    ExitCode::SUCCESS
}

fn say(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

fn parse(args: &[String]) -> Result<WorkerArgs, String> {
    let value = |flag: &str| -> Result<&str, String> {
        args.iter()
            .position(|arg| arg == flag)
            .and_then(|at| args.get(at + 1))
            .map(String::as_str)
            .ok_or_else(|| format!("missing {flag}"))
    };
    let number = |flag: &str| -> Result<u64, String> {
        value(flag)?
            .parse()
            .map_err(|_| format!("{flag} takes a number"))
    };
    let peer = value("--peer")?;
    Ok(WorkerArgs {
        kind: PeerKind::from_id(peer).ok_or_else(|| format!("unknown peer {peer}"))?,
        url: value("--url")?.to_owned(),
        prefix: value("--prefix")?.to_owned(),
        tasks: number("--tasks")? as usize,
        sections: number("--sections")? as usize,
        raw_retry: Duration::from_millis(number("--raw-retry-ms")?),
    })
}
