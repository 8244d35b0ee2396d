//! Whether the crate being built renamed its lock-runtime dependency, read from its
//! `Cargo.toml`: then `::lock_runtime` names nothing, and the attribute says so
//! once, with the `crate` option to write, instead of leaving the compiler to
//! report each path it cannot find.

use std::path::{Path, PathBuf};

const RUNTIME: &str = "lock-runtime";

/// The name the crate being built gives lock-runtime, when it depends on it only
/// under another name (`locks = { package = "lock-runtime" }`, directly or through
/// the workspace's dependencies). `None` when it names it `lock-runtime`, or when
/// the manifest says neither.
pub(crate) fn renamed_runtime() -> Option<String> {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
    let workspace = workspace_manifest(&dir);
    renamed(&manifest, workspace.as_deref())
}

fn workspace_manifest(dir: &Path) -> Option<String> {
    dir.ancestors().skip(1).find_map(|dir| {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
        manifest
            .lines()
            .any(|line| line.trim() == "[workspace]")
            .then_some(manifest)
    })
}

fn renamed(manifest: &str, workspace: Option<&str>) -> Option<String> {
    let own = dependencies(manifest);
    if own.iter().any(|dependency| dependency.is_runtime_by_name()) {
        return None;
    }
    let inherited = workspace.map(dependencies).unwrap_or_default();
    own.into_iter().find_map(|dependency| {
        let renames = dependency.package.as_deref() == Some(RUNTIME)
            || (dependency.inherited
                && inherited.iter().any(|shared| {
                    shared.name == dependency.name && shared.package.as_deref() == Some(RUNTIME)
                }));
        renames.then(|| dependency.name.replace('-', "_"))
    })
}

/// One entry of a dependency table, as far as the name goes.
#[derive(Default)]
struct Dependency {
    name: String,
    package: Option<String>,
    inherited: bool,
}

impl Dependency {
    fn is_runtime_by_name(&self) -> bool {
        self.name.replace('_', "-") == RUNTIME && self.package.is_none()
    }
}

/// The entries of every dependency table: `[dependencies]`, `[dev-dependencies]`,
/// `[target.'..'.dependencies]`, `[workspace.dependencies]`, and
/// `[dependencies.name]` tables. A plain line scan, enough for the names.
fn dependencies(manifest: &str) -> Vec<Dependency> {
    let mut found: Vec<Dependency> = Vec::new();
    // Inside `[..dependencies]`; or inside `[..dependencies.name]`, at that entry.
    let mut in_table = false;
    let mut in_entry = false;
    for line in manifest.lines() {
        let line = uncommented(line).trim();
        if let Some(header) = line.strip_prefix('[') {
            let header = header.trim_end_matches(']').trim();
            in_table = header.ends_with("dependencies");
            in_entry = false;
            if let Some((table, name)) = header.rsplit_once('.')
                && table.ends_with("dependencies")
            {
                found.push(Dependency {
                    name: unquoted(name),
                    ..Dependency::default()
                });
                in_entry = true;
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        if in_entry {
            let entry = found.last_mut().expect("an entry table was found");
            read_field(entry, key, value);
        } else if in_table {
            let (name, field) = match key.split_once('.') {
                Some((name, field)) => (unquoted(name), Some(field.trim())),
                None => (unquoted(key), None),
            };
            let at = match found.iter().position(|entry| entry.name == name) {
                Some(at) => at,
                None => {
                    found.push(Dependency {
                        name,
                        ..Dependency::default()
                    });
                    found.len() - 1
                }
            };
            match field {
                Some(field) => read_field(&mut found[at], field, value),
                None => read_inline_table(&mut found[at], value),
            }
        }
    }
    found
}

/// `{ package = "lock-runtime", version = "0.1" }`
fn read_inline_table(entry: &mut Dependency, value: &str) {
    let Some(fields) = value
        .strip_prefix('{')
        .and_then(|fields| fields.strip_suffix('}'))
    else {
        return;
    };
    for field in fields.split(',') {
        if let Some((key, value)) = field.split_once('=') {
            read_field(entry, key.trim(), value.trim());
        }
    }
}

fn read_field(entry: &mut Dependency, key: &str, value: &str) {
    match unquoted(key).as_str() {
        "package" => entry.package = Some(unquoted(value)),
        "workspace" => entry.inherited = value == "true",
        _ => {}
    }
}

fn unquoted(text: &str) -> String {
    text.trim().trim_matches(['"', '\'']).to_owned()
}

/// The line up to a `#` that is not inside a string.
fn uncommented(line: &str) -> &str {
    let mut quote = None;
    for (at, c) in line.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(open), c) if c == open => quote = None,
            (None, '#') => return &line[..at],
            _ => {}
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::renamed;

    #[test]
    fn a_dependency_under_its_own_name_is_not_renamed() {
        let manifest = r#"
            [package]
            name = "shop" # lock-runtime below
            [dependencies]
            lock-runtime = { version = "0.1", features = ["axum"] }
            locks = { package = "lock-runtime", version = "0.1" }
        "#;
        assert_eq!(renamed(manifest, None), None);
        assert_eq!(
            renamed("[dependencies]\nlock_runtime = \"0.1\"", None),
            None
        );
        assert_eq!(renamed("[dependencies]\nserde = \"1\"", None), None);
        assert_eq!(
            renamed("[dependencies.lock-runtime]\nversion = \"0.1\"", None),
            None
        );
    }

    #[test]
    fn a_rename_is_found_in_every_form() {
        let inline = "[dependencies]\nlocks = { version = \"0.1\", package = \"lock-runtime\" }";
        assert_eq!(renamed(inline, None).as_deref(), Some("locks"));
        let dotted = "[dev-dependencies]\nmy-locks.package = \"lock-runtime\"";
        assert_eq!(renamed(dotted, None).as_deref(), Some("my_locks"));
        let table =
            "[target.'cfg(unix)'.dependencies.locks]\npackage = 'lock-runtime'\n[features]\nx = []";
        assert_eq!(renamed(table, None).as_deref(), Some("locks"));
        let member = "[dependencies]\nlocks = { workspace = true }";
        let workspace = "[workspace]\n[workspace.dependencies]\nlocks = { package = \"lock-runtime\", path = \"x\" }";
        assert_eq!(renamed(member, Some(workspace)).as_deref(), Some("locks"));
        assert_eq!(
            renamed("[dependencies]\nlocks.workspace = true", Some(workspace)).as_deref(),
            Some("locks")
        );
    }

    #[test]
    fn commented_out_renames_do_not_count() {
        let manifest = "[dependencies]\n# locks = { package = \"lock-runtime\" }\nserde = \"1\" # package = \"lock-runtime\"";
        assert_eq!(renamed(manifest, None), None);
    }
}
