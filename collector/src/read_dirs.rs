//! Where a process's file reads came from, by directory, in a list short
//! enough to read: at most `DIRS` entries. A worker that starts inside the
//! window reads its job's modules first (thousands of files in hundreds of
//! `__pycache__` directories) and its dataset after; cutting the list at
//! the directories with the most bytes would hide a few dataset reads
//! behind the imports. Instead, as `du --max-depth` would, the deepest
//! directories are folded into the directory they share, so the deep
//! trees of installed packages become a few entries such as a venv's
//! `site-packages/torch`, while the shallower directories, a dataset's
//! among them, keep their own however few bytes they have. A dataset
//! spread over more directories than the list holds is folded into the
//! directory that holds them.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::process_files::FileReads;

/// The reads of the files of one directory, or of a subtree.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct DirIo {
    pub dir: String,
    pub bytes: u64,
    pub reads: u64,
    pub files: u64,
    /// Directories below `dir` whose reads this entry also holds (0: only
    /// the files directly in `dir`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub subdirs: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Entries a list of directories keeps.
pub const DIRS: usize = 32;
/// The entry that sums what folding could not place: files named without
/// an absolute directory, past `DIRS`.
pub const OTHER_DIRS: &str = "(other directories)";

/// The directories of `paths`' files, most bytes first, folded to at most
/// `DIRS` entries.
pub fn by_directory<'a>(paths: impl IntoIterator<Item = (&'a str, FileReads)>) -> Vec<DirIo> {
    let mut dirs: BTreeMap<&str, DirIo> = BTreeMap::new();
    for (path, r) in paths {
        let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
        let e = dirs.entry(dir).or_insert_with(|| DirIo {
            dir: if dir.is_empty() && !path.starts_with('/') {
                // A name without a directory: an unknown file's.
                "(unknown)".into()
            } else if dir.is_empty() {
                "/".into()
            } else {
                dir.to_string()
            },
            ..Default::default()
        });
        e.bytes += r.bytes;
        e.reads += r.reads;
        e.files += 1;
    }
    let mut dirs = fold(dirs.into_values().collect());
    dirs.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.dir.cmp(&b.dir)));
    if dirs.len() > DIRS {
        let rest = dirs.split_off(DIRS);
        dirs.push(summed(OTHER_DIRS, rest));
    }
    dirs
}

/// One entry named `dir` for `entries`: each entry not named so is a
/// directory below it (or, for `OTHER_DIRS`, beside the list).
fn summed(dir: &str, entries: Vec<DirIo>) -> DirIo {
    entries.into_iter().fold(
        DirIo {
            dir: dir.to_string(),
            ..Default::default()
        },
        |mut a, d| {
            a.bytes += d.bytes;
            a.reads += d.reads;
            a.files += d.files;
            a.subdirs += d.subdirs + u64::from(dir != OTHER_DIRS && d.dir != dir);
            a
        },
    )
}

/// `dir` and each directory above it, up to `/`.
fn ancestors(dir: &str) -> impl Iterator<Item = &str> {
    std::iter::successors(Some(dir), |d| match d.rsplit_once('/') {
        Some(("", _)) if *d != "/" => Some("/"),
        Some((p, _)) if !p.is_empty() => Some(p),
        _ => None,
    })
}

/// Folds entries into the directories above them until at most `DIRS`
/// remain: the candidate directories (each holding two entries or more)
/// are taken deepest first, and at one depth fewest bytes first. Neither
/// changes as the entries below a directory fold, so one ordering serves
/// the whole fold; each directory's count of the entries below it is kept
/// as they fold (a worker that imports has thousands of directories: a
/// fold that looked through every entry at every step took a second of a
/// debug build's CPU for 3,000 of them). Entries without an absolute
/// directory stay as they are.
///
/// Why deepest first rather than fewest bytes first: a worker that has
/// just started has read a few dataset files and megabytes of modules, so
/// its dataset's directories would fold first.
fn fold(dirs: Vec<DirIo>) -> Vec<DirIo> {
    if dirs.len() <= DIRS {
        return dirs;
    }
    let mut tree = Tree::default();
    let at: Vec<Option<usize>> = dirs
        .iter()
        .map(|d| d.dir.starts_with('/').then(|| tree.add(&d.dir, d.bytes)))
        .collect();
    let mut order: Vec<usize> = (0..tree.nodes.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&tree.nodes[a], &tree.nodes[b]);
        y.depth
            .cmp(&x.depth)
            .then_with(|| x.bytes.cmp(&y.bytes))
            .then_with(|| x.path.cmp(&y.path))
    });
    let mut left = dirs.len();
    for p in order {
        if left <= DIRS {
            break;
        }
        let n = tree.nodes[p].entries;
        if n < 2 {
            continue;
        }
        // Its n entries become one: each directory above it holds n - 1
        // fewer.
        left -= n - 1;
        tree.nodes[p].folded = true;
        let mut up = Some(p);
        while let Some(u) = up {
            tree.nodes[u].entries -= n - 1;
            up = tree.nodes[u].parent;
        }
    }
    // Each entry goes into the highest folded directory above it, if any.
    let mut into: BTreeMap<usize, Vec<DirIo>> = BTreeMap::new();
    let mut out = Vec::new();
    for (d, at) in dirs.into_iter().zip(at) {
        match at.and_then(|i| tree.highest_folded(i)) {
            Some(f) => into.entry(f).or_default().push(d),
            None => out.push(d),
        }
    }
    out.extend(
        into.into_iter()
            .map(|(f, entries)| summed(&tree.nodes[f].path, entries)),
    );
    out
}

/// The directories of a fold: each entry's and every one above it.
#[derive(Default)]
struct Tree {
    nodes: Vec<Node>,
    index: HashMap<String, usize>,
}

struct Node {
    path: String,
    parent: Option<usize>,
    depth: usize,
    /// Bytes read below it (itself included).
    bytes: u64,
    /// Entries below it (itself included) as the fold stands.
    entries: usize,
    folded: bool,
}

impl Tree {
    /// Adds the entry at `dir` (absolute): it and each directory above it
    /// hold its bytes and one more entry. Its node's index.
    fn add(&mut self, dir: &str, bytes: u64) -> usize {
        let mut child: Option<usize> = None;
        let mut first = None;
        for a in ancestors(dir) {
            let i = match self.index.get(a) {
                Some(&i) => i,
                None => {
                    self.nodes.push(Node {
                        path: a.to_string(),
                        parent: None,
                        depth: a.matches('/').count() - usize::from(a == "/"),
                        bytes: 0,
                        entries: 0,
                        folded: false,
                    });
                    self.index.insert(a.to_string(), self.nodes.len() - 1);
                    self.nodes.len() - 1
                }
            };
            self.nodes[i].bytes += bytes;
            self.nodes[i].entries += 1;
            if let Some(c) = child {
                self.nodes[c].parent = Some(i);
            }
            child = Some(i);
            first.get_or_insert(i);
        }
        first.unwrap_or_default()
    }

    /// The highest folded directory at or above node `i`.
    fn highest_folded(&self, i: usize) -> Option<usize> {
        let mut found = None;
        let mut up = Some(i);
        while let Some(u) = up {
            if self.nodes[u].folded {
                found = Some(u);
            }
            up = self.nodes[u].parent;
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `dir` is `p` or below it (both absolute).
    fn under(dir: &str, p: &str) -> bool {
        p == "/"
            || dir
                .strip_prefix(p)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }

    fn reads(bytes: u64) -> FileReads {
        FileReads { bytes, reads: 1 }
    }

    #[test]
    fn ancestors_run_up_to_the_root() {
        assert_eq!(
            ancestors("/a/b/c").collect::<Vec<_>>(),
            ["/a/b/c", "/a/b", "/a", "/"]
        );
        assert_eq!(ancestors("/").collect::<Vec<_>>(), ["/"]);
        assert!(under("/a/b", "/a") && under("/a", "/a") && under("/a", "/"));
        assert!(!under("/ab", "/a"));
    }

    #[test]
    fn a_short_list_is_kept_whole() {
        let d = by_directory([("/data/a/1.jpg", reads(300)), ("/data/b/2.jpg", reads(500))]);
        assert_eq!(d.len(), 2);
        assert_eq!(
            (d[0].dir.as_str(), d[0].bytes, d[0].subdirs),
            ("/data/b", 500, 0)
        );
    }

    /// A worker that imports: 300 module directories with more bytes each
    /// than its dataset's two directories together. The modules fold into
    /// their trees; the dataset keeps its directories.
    #[test]
    fn imports_fold_and_a_few_dataset_reads_keep_their_directories() {
        let mut paths: Vec<(String, FileReads)> = (0..300)
            .map(|i| {
                (
                    format!(
                        "/venv/lib/site-packages/pkg{}/sub{i}/__pycache__/m.pyc",
                        i % 7
                    ),
                    reads(20_000),
                )
            })
            .collect();
        paths.push((
            "/usr/lib/python3.11/__pycache__/os.pyc".into(),
            reads(30_000),
        ));
        paths.push((
            "/usr/lib/python3.11/json/__pycache__/a.pyc".into(),
            reads(9_000),
        ));
        paths.push(("/tmp/ds/images/cls0/0.jpg".into(), reads(3_000)));
        paths.push(("/tmp/ds/images/cls1/1.jpg".into(), reads(2_000)));
        let d = by_directory(paths.iter().map(|(p, r)| (p.as_str(), *r)));
        assert!(d.len() <= DIRS, "{d:?}");
        assert!(d.iter().all(|e| e.dir != OTHER_DIRS), "{d:?}");
        let find = |dir: &str| d.iter().find(|e| e.dir == dir);
        assert_eq!(find("/tmp/ds/images/cls0").map(|e| e.bytes), Some(3_000));
        assert_eq!(find("/tmp/ds/images/cls1").map(|e| e.bytes), Some(2_000));
        let total: u64 = d.iter().map(|e| e.bytes).sum();
        assert_eq!(total, 300 * 20_000 + 30_000 + 9_000 + 5_000);
        let files: u64 = d.iter().map(|e| e.files).sum();
        assert_eq!(files, 304);
        // Each package's 300/7 directories and their `__pycache__`s are
        // one entry at most.
        let venv: Vec<&DirIo> = d.iter().filter(|e| e.dir.starts_with("/venv")).collect();
        assert!(venv.len() <= 7, "{venv:?}");
        let sub: u64 = venv.iter().map(|e| e.subdirs).sum();
        assert_eq!(sub, 300, "{venv:?}");
    }

    /// A dataset of more directories than the list holds folds into the
    /// directory above them, which the JSON says holds subdirectories.
    #[test]
    fn a_dataset_of_many_directories_folds_into_its_root() {
        let paths: Vec<(String, FileReads)> = (0..100)
            .map(|i| (format!("/data/train/c{i:03}/x.jpg"), reads(1_000 + i)))
            .chain([("/usr/lib/python3.11/os.py".into(), reads(500))])
            .collect();
        let d = by_directory(paths.iter().map(|(p, r)| (p.as_str(), *r)));
        assert!(d.len() <= DIRS, "{d:?}");
        let bytes: u64 = d
            .iter()
            .filter(|e| under(&e.dir, "/data/train"))
            .map(|e| e.bytes)
            .sum();
        assert_eq!(bytes, (0..100).map(|i| 1_000 + i).sum::<u64>());
        assert!(d.iter().any(|e| e.dir == "/usr/lib/python3.11"));
        let folded = d.iter().find(|e| e.subdirs > 0).expect("a folded entry");
        assert!(folded.dir.starts_with("/data/train"), "{folded:?}");
        let j = serde_json::to_value(folded).unwrap();
        assert!(j["subdirs"].as_u64().unwrap() > 0);
        let plain = serde_json::to_value(d.iter().find(|e| e.subdirs == 0).unwrap()).unwrap();
        assert!(plain.get("subdirs").is_none(), "{plain}");
    }

    /// Thousands of directories in a few trees: at most `DIRS` entries,
    /// every byte, file and directory still counted once.
    #[test]
    fn thousands_of_directories_keep_their_totals() {
        let paths: Vec<(String, FileReads)> = (0..3000u64)
            .map(|i| {
                (
                    format!("/v/p{}/s{}/t{i}/m.pyc", i % 40, i % 400),
                    reads(1_000 + i),
                )
            })
            .chain([("rel/x".to_string(), reads(7))])
            .collect();
        let d = by_directory(paths.iter().map(|(p, r)| (p.as_str(), *r)));
        assert!(d.len() <= DIRS && d.len() > 1, "{d:?}");
        let sum = |f: fn(&DirIo) -> u64| d.iter().map(f).sum::<u64>();
        assert_eq!(
            sum(|e| e.bytes),
            paths.iter().map(|(_, r)| r.bytes).sum::<u64>()
        );
        assert_eq!(sum(|e| e.files), 3001);
        // Each read directory is an entry of its own or below a folded one
        // (no file here lies directly in a folded one).
        let plain = d.iter().filter(|e| e.subdirs == 0).count() as u64;
        assert_eq!(sum(|e| e.subdirs) + plain, 3001);
        assert!(d.iter().any(|e| e.dir == "rel"), "{d:?}");
    }

    /// Names without an absolute directory cannot fold; past the cap they
    /// are summed in one entry.
    #[test]
    fn relative_names_past_the_cap_are_summed() {
        let paths: Vec<(String, FileReads)> = (0..DIRS as u64 + 5)
            .map(|i| (format!("d{i:03}/f"), reads(1_000 - i)))
            .collect();
        let d = by_directory(paths.iter().map(|(p, r)| (p.as_str(), *r)));
        assert_eq!(d.len(), DIRS + 1);
        assert_eq!(d[0].dir, "d000");
        let other = d.last().unwrap();
        assert_eq!((other.dir.as_str(), other.files), (OTHER_DIRS, 5));
    }
}
