"""Starting the app: the QApplication, the checks of the user's files and of Qt's libraries, one instance."""
