// Lucene's BM25 as pyserini runs it (Anserini's DefaultEnglishAnalyzer, its bag-of-words query, BM25 k1 0.9 b 0.4),
// for experiments/search_r1/bm25_vs_lucene.py to compare ftw_jax's BM25 with. Reads passages as TSV (id, contents)
// and queries one a line; writes the analyzed words of each passage, or each query's top k passages.
//
//   java -cp anserini-0.21.0-fatjar.jar LuceneBM25.java analyze passages.tsv
//   java -cp anserini-0.21.0-fatjar.jar LuceneBM25.java search passages.tsv queries.txt 3
import io.anserini.analysis.AnalyzerUtils;
import io.anserini.analysis.DefaultEnglishAnalyzer;
import io.anserini.search.query.BagOfWordsQueryGenerator;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.apache.lucene.analysis.Analyzer;
import org.apache.lucene.document.Document;
import org.apache.lucene.document.Field;
import org.apache.lucene.document.StringField;
import org.apache.lucene.document.TextField;
import org.apache.lucene.index.DirectoryReader;
import org.apache.lucene.index.IndexWriter;
import org.apache.lucene.index.IndexWriterConfig;
import org.apache.lucene.search.IndexSearcher;
import org.apache.lucene.search.ScoreDoc;
import org.apache.lucene.search.similarities.BM25Similarity;
import org.apache.lucene.store.ByteBuffersDirectory;

public class LuceneBM25 {
  public static void main(String[] args) throws Exception {
    Analyzer analyzer = DefaultEnglishAnalyzer.newDefaultInstance();
    List<String> passages = Files.readAllLines(Path.of(args[1]));
    if (args[0].equals("analyze")) {
      for (String line : passages) {
        System.out.println(String.join(" ", AnalyzerUtils.analyze(analyzer, line.split("\t", 2)[1])));
      }
      return;
    }
    ByteBuffersDirectory directory = new ByteBuffersDirectory();
    BM25Similarity similarity = new BM25Similarity(0.9f, 0.4f);
    IndexWriterConfig config = new IndexWriterConfig(analyzer).setSimilarity(similarity);
    try (IndexWriter writer = new IndexWriter(directory, config)) {
      for (String line : passages) {
        String[] parts = line.split("\t", 2);
        Document document = new Document();
        document.add(new StringField("id", parts[0], Field.Store.YES));
        document.add(new TextField("contents", parts[1], Field.Store.NO));
        writer.addDocument(document);
      }
    }
    IndexSearcher searcher = new IndexSearcher(DirectoryReader.open(directory));
    searcher.setSimilarity(similarity);
    int k = Integer.parseInt(args[3]);
    for (String query : Files.readAllLines(Path.of(args[2]))) {
      StringBuilder ids = new StringBuilder(), scores = new StringBuilder();
      for (ScoreDoc hit : searcher.search(new BagOfWordsQueryGenerator().buildQuery("contents", analyzer, query), k).scoreDocs) {
        ids.append(searcher.doc(hit.doc).get("id")).append(' ');
        scores.append(hit.score).append(' ');
      }
      System.out.println(ids.toString().trim() + "\t" + scores.toString().trim());
    }
  }
}
