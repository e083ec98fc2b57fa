//! The task graph: compact adjacency in both directions, built from parent lists,
//! with an acyclicity check that names a cycle's path. Pure, iterative, no recursion.

use std::collections::HashMap;

use petgraph::graph::{DiGraph, NodeIndex};

/// Adjacency of a job's tasks in compressed sparse rows, parents and children.
/// Task `i`'s parents are `parents[parent_offsets[i]..parent_offsets[i + 1]]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dag {
    parent_offsets: Vec<u32>,
    parents: Vec<u32>,
    child_offsets: Vec<u32>,
    children: Vec<u32>,
}

/// A cycle found in a graph, as task indices, each depending on the next,
/// the last depending on the first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cycle(pub Vec<u32>);

impl Dag {
    /// Builds the graph from each task's parent indices. Every index must be
    /// below the number of lists; cycles are not checked here.
    pub fn from_parents<L: AsRef<[u32]>>(parent_lists: &[L]) -> Dag {
        let n = parent_lists.len();
        let n_edges: usize = parent_lists.iter().map(|p| p.as_ref().len()).sum();
        let mut parent_offsets = Vec::with_capacity(n + 1);
        let mut parents = Vec::with_capacity(n_edges);
        let mut n_children = vec![0u32; n];
        parent_offsets.push(0);
        for list in parent_lists {
            for &p in list.as_ref() {
                parents.push(p);
                n_children[p as usize] += 1;
            }
            parent_offsets.push(parents.len() as u32);
        }
        let mut child_offsets = Vec::with_capacity(n + 1);
        child_offsets.push(0u32);
        let mut total = 0u32;
        for count in &n_children {
            total += count;
            child_offsets.push(total);
        }
        let mut cursor: Vec<u32> = child_offsets[..n].to_vec();
        let mut children = vec![0u32; n_edges];
        for (child, list) in parent_lists.iter().enumerate() {
            for &p in list.as_ref() {
                let slot = &mut cursor[p as usize];
                children[*slot as usize] = child as u32;
                *slot += 1;
            }
        }
        Dag { parent_offsets, parents, child_offsets, children }
    }

    pub fn len(&self) -> usize {
        self.parent_offsets.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn n_edges(&self) -> usize {
        self.parents.len()
    }

    pub fn parents(&self, task: u32) -> &[u32] {
        let t = task as usize;
        &self.parents[self.parent_offsets[t] as usize..self.parent_offsets[t + 1] as usize]
    }

    pub fn children(&self, task: u32) -> &[u32] {
        let t = task as usize;
        &self.children[self.child_offsets[t] as usize..self.child_offsets[t + 1] as usize]
    }

    pub fn in_degree(&self, task: u32) -> u32 {
        let t = task as usize;
        self.parent_offsets[t + 1] - self.parent_offsets[t]
    }

    /// Tasks with no dependencies, in index order.
    pub fn roots(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.len() as u32).filter(|&t| self.in_degree(t) == 0)
    }

    /// Each task's parent list, for persisting.
    pub fn parent_lists(&self) -> Vec<Vec<u32>> {
        (0..self.len() as u32).map(|t| self.parents(t).to_vec()).collect()
    }

    /// A topological order, or a cycle when there is one.
    pub fn check_acyclic(&self) -> Result<Vec<u32>, Cycle> {
        let mut graph: DiGraph<(), (), u32> = DiGraph::with_capacity(self.len(), self.n_edges());
        for _ in 0..self.len() {
            graph.add_node(());
        }
        for child in 0..self.len() as u32 {
            for &parent in self.parents(child) {
                graph.add_edge(NodeIndex::new(parent as usize), NodeIndex::new(child as usize), ());
            }
        }
        match petgraph::algo::toposort(&graph, None) {
            Ok(order) => Ok(order.into_iter().map(|n| n.index() as u32).collect()),
            Err(_) => Err(self.find_cycle(&graph)),
        }
    }

    /// Finds one cycle: inside a strongly connected component of more than
    /// one task, every task has a parent in the component, so walking from
    /// parent to parent must come back to a task already seen.
    fn find_cycle(&self, graph: &DiGraph<(), (), u32>) -> Cycle {
        let component = petgraph::algo::kosaraju_scc(graph)
            .into_iter()
            .find(|c| c.len() > 1 || c.iter().any(|n| self.parents(n.index() as u32).contains(&(n.index() as u32))))
            .unwrap_or_default();
        let mut in_component = vec![false; self.len()];
        for node in &component {
            in_component[node.index()] = true;
        }
        let Some(start) = component.first() else {
            return Cycle(Vec::new());
        };
        let mut seen_at: HashMap<u32, usize> = HashMap::new();
        let mut walk: Vec<u32> = Vec::new();
        let mut current = start.index() as u32;
        loop {
            if let Some(&at) = seen_at.get(&current) {
                return Cycle(walk.split_off(at));
            }
            seen_at.insert(current, walk.len());
            walk.push(current);
            match self.parents(current).iter().find(|&&p| in_component[p as usize]) {
                Some(&parent) => current = parent,
                None => return Cycle(walk),
            }
        }
    }

    /// Every task that depends, directly or not, on `task`, found breadth first.
    pub fn descendants(&self, task: u32) -> Vec<u32> {
        let mut seen = vec![false; self.len()];
        let mut out = Vec::new();
        let mut queue = std::collections::VecDeque::from([task]);
        while let Some(t) = queue.pop_front() {
            for &child in self.children(t) {
                if !seen[child as usize] {
                    seen[child as usize] = true;
                    out.push(child);
                    queue.push_back(child);
                }
            }
        }
        out
    }

    /// Topological level of every task: 0 for roots, else one more than its deepest parent.
    pub fn levels(&self, topo_order: &[u32]) -> Vec<u32> {
        let mut level = vec![0u32; self.len()];
        for &t in topo_order {
            level[t as usize] = self.parents(t).iter().map(|&p| level[p as usize] + 1).max().unwrap_or(0);
        }
        level
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_both_directions() {
        let dag = Dag::from_parents(&[vec![], vec![0], vec![0, 1]]);
        assert_eq!(dag.len(), 3);
        assert_eq!(dag.n_edges(), 3);
        assert_eq!(dag.children(0), &[1, 2]);
        assert_eq!(dag.children(1), &[2]);
        assert_eq!(dag.parents(2), &[0, 1]);
        assert_eq!(dag.roots().collect::<Vec<_>>(), vec![0]);
        let order = dag.check_acyclic().unwrap();
        assert_eq!(order, vec![0, 1, 2]);
        assert_eq!(dag.levels(&order), vec![0, 1, 2]);
        assert_eq!(dag.descendants(0), vec![1, 2]);
    }

    #[test]
    fn finds_a_cycle_and_its_path() {
        // 0 <- 1 <- 2 <- 3 <- 1 : the cycle is 1, 2, 3 (each depends on the next's parent).
        let dag = Dag::from_parents(&[vec![], vec![0, 3], vec![1], vec![2]]);
        let Cycle(path) = dag.check_acyclic().unwrap_err();
        assert_eq!(path.len(), 3);
        for window in 0..path.len() {
            let task = path[window];
            let next = path[(window + 1) % path.len()];
            assert!(dag.parents(task).contains(&next), "{task} should depend on {next}");
        }
    }

    #[test]
    fn long_chain_does_not_recurse() {
        let n = 1_000_000u32;
        let lists: Vec<Vec<u32>> = (0..n).map(|i| if i == 0 { vec![] } else { vec![i - 1] }).collect();
        let dag = Dag::from_parents(&lists);
        let order = dag.check_acyclic().unwrap();
        assert_eq!(order.len(), n as usize);
        assert_eq!(dag.descendants(0).len(), n as usize - 1);
    }
}
