module github.com/extractedprism/extractedprism/bench

go 1.26.8
